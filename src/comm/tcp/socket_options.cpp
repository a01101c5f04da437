#include "socket_options.hpp"

namespace cohort::comm::tcp {

void tune_connected(asio::ip::tcp::socket& socket) {
  asio::error_code ignored;  // a socket that refuses an option still works
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);
  asio::error_code unknown;
  const asio::ip::address local = socket.local_endpoint(unknown).address();
  const asio::ip::address remote = socket.remote_endpoint(unknown).address();
  if (!unknown && (remote.is_loopback() || remote == local))
    socket.set_option(asio::socket_base::send_buffer_size(kSameHostSendBuffer), ignored);
}

}  // namespace cohort::comm::tcp
