// The process-wide host synchronisation counter.
#include "core/host_sync.hpp"

#include <atomic>

namespace wd {

namespace {
// A counter, not configuration: the only state here, read by tests and never reset.
std::atomic<std::int64_t> syncs{0};
}  // namespace

std::int64_t host_sync_count() { return syncs.load(std::memory_order_relaxed); }

void note_host_sync(const char*) { syncs.fetch_add(1, std::memory_order_relaxed); }

}  // namespace wd
