# CTest driver for example_custom_model: cmake -DBINARY=... -DDATA_DIR=... -P run_custom_model_test.cmake
# Fails unless --help lists lenet_small's defaults, the run exits 0, prints "final: model=lenet_small ..." and a test accuracy >= 0.80.
if(NOT EXISTS "${DATA_DIR}/train-images-idx3-ubyte")
  message(FATAL_ERROR "MNIST is missing from ${DATA_DIR}; run scripts/test.sh (or scripts/run_mnist.sh) to fetch it")
endif()
# The registered model's own defaults are listed in --help beside the seed models'.
execute_process(COMMAND "${BINARY}" train --help OUTPUT_VARIABLE help RESULT_VARIABLE help_exit)
if(NOT help_exit EQUAL 0 OR NOT help MATCHES "vgg19 100, ctr 1000, lenet_small 2000\\)")
  message(FATAL_ERROR "custom_model train --help does not show lenet_small's --train_steps default:\n${help}")
endif()
# Its own setting too, with its default, and refused with one line when bad or not the --model's.
if(NOT help MATCHES "Model settings:[^-]*--conv1_filters TEXT=8 +filters of lenet_small's first convolution")
  message(FATAL_ERROR "custom_model train --help does not list lenet_small's --conv1_filters setting:\n${help}")
endif()
execute_process(COMMAND "${BINARY}" train --model=lenet_small --conv1_filters=0 ERROR_VARIABLE err RESULT_VARIABLE code)
if(NOT code EQUAL 2 OR NOT err MATCHES "--conv1_filters=0 must be an integer in 1..256")
  message(FATAL_ERROR "--conv1_filters=0 gave exit ${code}: ${err}")
endif()
execute_process(COMMAND "${BINARY}" train --model=mlp --conv1_filters=4 ERROR_VARIABLE err RESULT_VARIABLE code)
if(NOT code EQUAL 2 OR NOT err MATCHES "--conv1_filters=4 is a setting of model lenet_small, not of --model=mlp")
  message(FATAL_ERROR "--conv1_filters with --model=mlp gave exit ${code}: ${err}")
endif()
# A run with the setting given: every task (the launcher passes it on) builds 4 filters (a worker
# building other shapes than the chief's is refused).
execute_process(
  COMMAND "${BINARY}" local --ps=1 --workers=2 --model=lenet_small --conv1_filters=4 --train_steps=300 --log_every=100
          --data_dir=${DATA_DIR}
  RESULT_VARIABLE exit_code
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
message("${output}")
if(NOT exit_code EQUAL 0)
  message(FATAL_ERROR "custom_model local exited with ${exit_code}")
endif()
if(NOT output MATCHES "conv1/weights +\\[5,5,1,4\\]" OR NOT output MATCHES "conv2/weights +\\[5,5,4,16\\]")
  message(FATAL_ERROR "the placement listing does not show conv1 with --conv1_filters=4 filters")
endif()
if(NOT output MATCHES "final: model=lenet_small mode=async workers=2 ps=1 global_step=([0-9]+)")
  message(FATAL_ERROR "no summary line for lenet_small in the output")
endif()
if(CMAKE_MATCH_1 LESS 300)
  message(FATAL_ERROR "global_step ${CMAKE_MATCH_1} < --train_steps=300")
endif()
if(NOT output MATCHES "test_accuracy=([0-9.]+)")
  message(FATAL_ERROR "no test_accuracy in the summary line")
endif()
# CMake compares numbers as doubles with LESS.
if(CMAKE_MATCH_1 LESS 0.80)
  message(FATAL_ERROR "test_accuracy ${CMAKE_MATCH_1} < 0.80 after 300 steps: the example model did not learn")
endif()
