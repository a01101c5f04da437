#pragma once
// One connection's bytes: plain TCP, or TLS 1.3 over it once start_tls() is called. Asio's composed reads
// and writes (asio::async_read, asio::async_write) take it as they take a socket. Like the socket, it is
// used from the transport's I/O thread only.
#include <asio.hpp>
#include <asio/ssl.hpp>

#include <optional>
#include <utility>

#include "tls_context.hpp"
#include "tls_stream.hpp"

namespace cohort::comm::tcp {

class Stream {
 public:
  using executor_type = asio::ip::tcp::socket::executor_type;

  explicit Stream(asio::io_context& io) : plain_(io) {}

  asio::ip::tcp::socket& socket() { return tls_ ? tls_->socket() : plain_; }
  bool is_open() { return socket().is_open(); }
  void close(asio::error_code& error) { socket().close(error); }
  executor_type get_executor() { return socket().get_executor(); }

  // From here on every byte goes through TLS; `handler(error)` runs when the TLS handshake is over.
  template <typename Handler>
  void start_tls(TlsContext& context, asio::ssl::stream_base::handshake_type side, Handler&& handler) {
    tls_.emplace(std::move(plain_), context.context(), context.record_engine());
    tls_->async_handshake(side, std::forward<Handler>(handler));
  }
  bool tls() const { return tls_.has_value(); }

  template <typename Buffers, typename Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) tls_->async_read_some(buffers, std::forward<Handler>(handler));
    else plain_.async_read_some(buffers, std::forward<Handler>(handler));
  }

  template <typename Buffers, typename Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) tls_->async_write_some(buffers, std::forward<Handler>(handler));
    else plain_.async_write_some(buffers, std::forward<Handler>(handler));
  }

 private:
  asio::ip::tcp::socket plain_;  // moved into tls_ by start_tls()
  std::optional<TlsStream> tls_;
};

}  // namespace cohort::comm::tcp
