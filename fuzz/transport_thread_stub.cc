// The coding fuzzer links message.cc without the gRPC transport (grpc_transport.cc, which owns the
// polling threads). No transport thread exists in the fuzzer, so the answer is always "no".
namespace psflow::rpc {
bool OnTransportThread() { return false; }
}  // namespace psflow::rpc
