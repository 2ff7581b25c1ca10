// Routes UCX's log (ucs) into kvferry's logger instead of stderr. Installed once per
// process, by the first ucx transport.
//
// Thread-safety: install_ucx_log_handler may be called from any thread, any number of times.
#pragma once

namespace kvferry::detail {

void install_ucx_log_handler();

}  // namespace kvferry::detail
