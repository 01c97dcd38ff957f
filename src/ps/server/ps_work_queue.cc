// PsServer: the WorkQueue call (ps/server/work_queue.h), answered by ps task 0 only.
#include "absl/strings/str_cat.h"
#include "ps/server/ps_server_impl.h"

namespace psflow::ps {
namespace {

void FillProgress(const WorkQueue::Progress& p, wire::WorkQueueResponse* r) {
  r->set_held(p.held);
  for (int w : p.holders) r->add_holders(w);
  r->set_handed(p.handed);
  r->set_total(p.total);
  r->set_returned(p.returned);
  r->set_at_end(p.end);
  r->set_examples(p.examples);
  r->set_bad_lines(p.bad_lines);
  r->set_epoch_now(p.epoch);
}

}  // namespace

void PsServer::Impl::HandleWorkQueue(const rpc::IncomingMessage& request, rpc::Responder responder) {
  wire::WorkQueueRequest call;
  if (absl::Status s = request.ParseHeader(&call); !s.ok()) return responder.Respond(s);
  if (options_.task_index != 0) {
    return responder.Respond(absl::FailedPreconditionError(
        absl::StrCat("ps task ", options_.task_index, " holds no work queue: ask ps task 0")));
  }
  if (aborted_.load(std::memory_order_acquire)) return responder.Respond(FinishedError());
  wire::WorkQueueResponse answer;
  switch (call.op()) {
    case wire::WorkQueueRequest::CONFIGURE: {
      if (absl::Status s = work_queue_.Restore(call.state_json(), call.replace()); !s.ok()) {
        return responder.Respond(s);
      }
      break;
    }
    case wire::WorkQueueRequest::NEXT: {
      if (!work_queue_.configured()) break;  // answered configured = false: the worker waits for the chief
      absl::StatusOr<WorkQueue::Taken> taken =
          work_queue_.Next(call.worker_index(), call.seq(), call.fresh(), call.examples(), call.bad_lines());
      if (!taken.ok()) return responder.Respond(taken.status());
      answer.set_end(taken->end);
      answer.set_epoch(taken->epoch);
      answer.set_slice(taken->slice);
      answer.set_path(taken->path);
      answer.set_begin(taken->begin);
      answer.set_end_offset(taken->end_offset == kWorkSliceToEnd ? -1 : taken->end_offset);
      break;
    }
    case wire::WorkQueueRequest::RELEASE: {
      if (!work_queue_.configured()) break;
      work_queue_.Release(call.worker_index(), call.examples(), call.bad_lines());
      break;
    }
    case wire::WorkQueueRequest::STATE: {
      if (!work_queue_.configured()) break;
      absl::StatusOr<std::string> state = work_queue_.State();
      if (!state.ok()) return responder.Respond(state.status());
      answer.set_state_json(*std::move(state));
      break;
    }
    default:
      return responder.Respond(absl::InvalidArgumentError(absl::StrCat("WorkQueue: unknown op ", call.op())));
  }
  answer.set_configured(work_queue_.configured());
  if (answer.configured()) FillProgress(work_queue_.progress(), &answer);
  responder.Respond(rpc::OutgoingMessage::Of(answer));
}

}  // namespace psflow::ps
