// PsServer: the table checkpoint calls. LoadTable stores a checkpoint's rows (the chief restoring,
// between Initialize and MarkInitialized); ScanTable answers one part of a table shard's scan, its
// cursor kept by PsTables under the scan's id. Both are PsTables' (ps/server/ps_tables.h) behind the
// model's checks.
#include "absl/strings/str_cat.h"
#include "ps/common/wire_config.h"
#include "ps/server/ps_server_impl.h"

namespace psflow::ps {

void PsServer::Impl::HandleLoadTable(const rpc::IncomingMessage& request, rpc::Responder responder) {
  std::shared_ptr<const Model> m = model();
  wire::LoadTableRequest load;
  if (absl::Status s = request.ParseHeader(&load); !s.ok()) return responder.Respond(s);
  if (m == nullptr) return responder.Respond(absl::FailedPreconditionError(kNotInitializedMessage));
  // After Initialize, before MarkInitialized (a retry stores the same rows again, which Load allows).
  if (initialized()) {
    return responder.Respond(absl::FailedPreconditionError("table rows loaded after MarkInitialized"));
  }
  if (absl::Status s = m->tables->Load(load.rows(), request); !s.ok()) {
    return responder.Respond(absl::InvalidArgumentError(absl::StrCat("restore: ", s.message())));
  }
  wire::LoadTableResponse answer;
  answer.set_step(step_.load());
  responder.Respond(rpc::OutgoingMessage::Of(answer));
}

void PsServer::Impl::HandleScanTable(const rpc::IncomingMessage& request, rpc::Responder responder) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr || !initialized()) {
    return responder.Respond(absl::FailedPreconditionError(kNotInitializedMessage));
  }
  wire::TableScan scan;
  if (absl::Status s = request.ParseHeader(&scan); !s.ok()) return responder.Respond(s);
  wire::ScanTableResponse header;
  header.set_step(step_.load(std::memory_order_acquire));
  rpc::OutgoingMessage response;
  if (absl::Status s = m->tables->ScanPart(scan, header.step(), header.mutable_part(), &response); !s.ok()) {
    return responder.Respond(s);
  }
  response.header = header.SerializeAsString();
  responder.Respond(std::move(response));
}

}  // namespace psflow::ps
