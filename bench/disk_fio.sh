#!/bin/sh
# bench/disk_fio.sh — the disk's own random-read limit beside bench/disk_table_bench.cc's rows/s
# (docs/table-storage-figures.md#from-the-device): 4 KiB random reads with O_DIRECT (RocksDB's blocks are 4 KiB) from a
# 1 GiB file, one reader (what one MultiGet does: one read after the other) and 4 readers side by
# side (what the disk tier does with its default 3 read threads and the caller). Prints IOPS.
#   bench/disk_fio.sh [DIR (default /var/tmp)] [SECONDS a run (default 10)]
# Needs fio (Debian package, in scripts/setup.sh). The file is removed at the end.
set -eu
DIR=${1:-/var/tmp}
SECS=${2:-10}
FILE="$DIR/psflow_fio_$$.dat"
trap 'rm -f "$FILE"' EXIT
for JOBS in 1 4; do
  fio --name=randread --filename="$FILE" --size=1G --rw=randread --bs=4k --direct=1 --ioengine=psync \
      --numjobs="$JOBS" --group_reporting --runtime="$SECS" --time_based --output-format=json |
    /usr/bin/python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['read']; \
print(f'fio randread 4k O_DIRECT, $JOBS reader(s): {j[\"iops\"]:.0f} IOPS, mean latency {j[\"clat_ns\"][\"mean\"]/1e3:.0f} us')"
done
