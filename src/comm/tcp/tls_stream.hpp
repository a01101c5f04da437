#pragma once
// TlsStream: TLS 1.3 over a TCP socket. OpenSSL runs the handshake; from then on the records are sealed
// and opened here (tls_records.hpp), as the kernel's TLS offload would: straight from the caller's buffer
// into the outgoing buffer, and from the incoming buffer straight into the caller's, with no copy of
// OpenSSL's own in between. A write seals up to kWriteBatch of its bytes (32 records of 16 KiB) and sends
// them with one socket write; a read takes as many bytes as the socket has and opens every whole record.
// Like the socket, it is used by one thread at a time, with at most one read and one write in flight. One
// sender empties the outgoing buffer at a time: a write completes when it is empty, and what a read answers
// (an alert, a KeyUpdate) leaves with it.
#include <asio.hpp>
#include <asio/ssl.hpp>
#include <openssl/ssl.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "tls_records.hpp"

namespace cohort::comm::tcp {

class TlsStream {
 public:
  using executor_type = asio::ip::tcp::socket::executor_type;

  TlsStream(asio::ip::tcp::socket socket, asio::ssl::context& context, RecordEngine engine);
  TlsStream(const TlsStream&) = delete;  // pending handlers point at it
  TlsStream& operator=(const TlsStream&) = delete;

  asio::ip::tcp::socket& socket() { return socket_; }
  executor_type get_executor() { return socket_.get_executor(); }

  // `handler(error)` once the TLS handshake is over, as client or server.
  template <typename Handler>
  void async_handshake(asio::ssl::stream_base::handshake_type side, Handler handler) {
    if (side == asio::ssl::stream_base::client) SSL_set_connect_state(ssl_.get());
    else SSL_set_accept_state(ssl_.get());
    handshake_step(std::move(handler));
  }

  template <typename Buffers, typename Handler>
  void async_read_some(const Buffers& buffers, Handler handler) {
    const asio::mutable_buffer first = asio::buffer_sequence_begin(buffers) == asio::buffer_sequence_end(buffers)
                                           ? asio::mutable_buffer()
                                           : asio::mutable_buffer(*asio::buffer_sequence_begin(buffers));
    read_step(first, std::move(handler));
  }

  template <typename Buffers, typename Handler>
  void async_write_some(const Buffers& buffers, Handler handler) {
    std::size_t taken = 0;
    for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers) && taken < kWriteBatch; ++it) {
      const asio::const_buffer buffer = asio::buffer(asio::const_buffer(*it), kWriteBatch - taken);
      const std::size_t sealed = seal(buffer);
      taken += sealed;
      if (sealed < buffer.size()) break;  // the outgoing buffer is full
    }
    // Nothing taken from bytes given: only an outgoing buffer still full could do that, and a write starts
    // with it empty (one write at a time, each completing once it is sent).
    const asio::error_code error = taken == 0 && asio::buffer_size(buffers) > 0 ? asio::error::no_buffer_space : asio::error_code();
    if (error || outgoing().size() == 0) return complete(std::move(handler), error, taken);
    flush([handler = std::move(handler), taken](const asio::error_code& flushed) mutable { handler(flushed, flushed ? 0 : taken); });
  }

  // How many KeyUpdates each side sent since the handshake, for tests.
  std::uint64_t key_updates_sent() const { return writer_ ? writer_->key_updates() : 0; }
  std::uint64_t key_updates_received() const { return reader_ ? reader_->key_updates() : 0; }

 private:
  // A write seals at most this much before its records leave. With ipsec-mb's AES-GCM, batches of 512 KiB
  // gave TLS 0.57-0.90x plain TCP's bandwidth from 64 KiB to 64 MiB (2 ranks), batches of 128 KiB 0.57-0.81x.
  static constexpr std::size_t kWriteBatch = 512 * 1024;
  // A read takes at most this much from the socket, so that the records are still in the cache when opened.
  static constexpr std::size_t kReadBytes = 256 * 1024;
  struct FreeSsl {
    void operator()(SSL* ssl) const { SSL_free(ssl); }
  };

  // Seals from `buffer` as much as the outgoing buffer holds; returns how many of its bytes.
  std::size_t seal(asio::const_buffer buffer);
  // Opens whole records into `out`; returns the bytes given, 0 when no whole record is in.
  std::size_t open(asio::mutable_buffer out, asio::error_code& error);
  // During the handshake: the socket's bytes to OpenSSL, and what OpenSSL wrote to the outgoing buffer.
  void give_openssl_incoming();
  void take_openssl_outgoing();
  // Once the handshake is over: the records' keys from OpenSSL, and the bytes it had not read yet.
  void take_over_records();
  // What a failed OpenSSL call amounts to: its own error, the peer's close, or none (it waits for bytes).
  asio::error_code failure(int result);
  // Where the next bytes from the socket go, straight into the incoming buffer.
  asio::mutable_buffer incoming_space();
  void took_in(std::size_t bytes) { incoming_end_ += bytes; }
  asio::const_buffer outgoing() { return {outgoing_.data() + outgoing_begin_, outgoing_end_ - outgoing_begin_}; }
  void sent(std::size_t bytes);

  template <typename Handler>
  void complete(Handler handler, const asio::error_code& error, std::size_t bytes) {
    asio::post(socket_.get_executor(), [handler = std::move(handler), error, bytes]() mutable { handler(error, bytes); });
  }

  // A continuation of a flush, run once the outgoing buffer is empty (or sending failed).
  class Flushed {
   public:
    virtual ~Flushed() = default;
    virtual void operator()(const asio::error_code& error) = 0;
  };
  template <typename Then>
  class FlushedThen final : public Flushed {
   public:
    explicit FlushedThen(Then then) : then_(std::move(then)) {}
    void operator()(const asio::error_code& error) override { then_(error); }

   private:
    Then then_;
  };

  // `then(error)` once the outgoing buffer is empty; starts sending it unless that is under way.
  template <typename Then>
  void flush(Then then) {
    waiting_for_flush_.push_back(std::make_unique<FlushedThen<Then>>(std::move(then)));
    if (!sending_) send_outgoing();
  }
  void send_outgoing() {
    const asio::const_buffer pending = outgoing();
    if (pending.size() == 0) return flushed(asio::error_code());
    sending_ = true;
    socket_.async_write_some(pending, [this](const asio::error_code& error, std::size_t bytes) {
      if (error) return flushed(error);
      sent(bytes);
      send_outgoing();
    });
  }
  void flushed(const asio::error_code& error) {
    sending_ = false;
    auto waiting = std::exchange(waiting_for_flush_, {});
    for (auto& then : waiting) (*then)(error);
  }

  template <typename Handler>
  void handshake_step(Handler handler) {
    give_openssl_incoming();
    ERR_clear_error();
    const int result = SSL_do_handshake(ssl_.get());
    asio::error_code error = result == 1 ? asio::error_code() : failure(result);
    take_openssl_outgoing();
    if (!error && result == 1) {
      try {
        take_over_records();
      } catch (const std::exception&) {
        error = std::make_error_code(std::errc::protocol_error);
      }
    }
    if (error && outgoing().size() > 0)  // the alert that tells the peer why
      return flush([handler = std::move(handler), error](const asio::error_code&) mutable { handler(error); });
    if (error || (result == 1 && outgoing().size() == 0))
      return asio::post(socket_.get_executor(), [handler = std::move(handler), error]() mutable { handler(error); });
    auto next = [this, handler = std::move(handler), done = result == 1](const asio::error_code& failed) mutable {
      if (failed || done) return handler(failed);
      fill([this, handler = std::move(handler)](const asio::error_code& read) mutable {
        if (read) return handler(read);
        handshake_step(std::move(handler));
      });
    };
    if (outgoing().size() > 0) return flush(std::move(next));
    next(asio::error_code());  // nothing to send: waits for the peer's bytes
  }

  template <typename Handler>
  void read_step(asio::mutable_buffer out, Handler handler) {
    asio::error_code error;
    const std::size_t given = out.size() == 0 ? 0 : open(out, error);
    // What the records answered (an alert, a KeyUpdate) leaves, without the read waiting for it: the peer
    // may be waiting for this side to read before it reads in turn. A failure to send shows on the reads.
    if (outgoing().size() > 0 && !sending_) flush([](const asio::error_code&) {});
    if (error || given > 0 || out.size() == 0) return complete(std::move(handler), error, given);
    fill([this, out, handler = std::move(handler)](const asio::error_code& failed) mutable {
      if (failed) return handler(failed, 0);
      read_step(out, std::move(handler));
    });
  }

  // Reads what the socket has into the incoming buffer, then `then(error)`.
  template <typename Then>
  void fill(Then then) {
    const asio::mutable_buffer space = incoming_space();
    socket_.async_read_some(space, [this, then = std::move(then)](const asio::error_code& error, std::size_t bytes) mutable {
      if (!error) took_in(bytes);
      then(error);
    });
  }

  asio::ip::tcp::socket socket_;
  RecordEngine engine_;
  std::unique_ptr<SSL, FreeSsl> ssl_;  // until the handshake is over
  std::optional<RecordWriter> writer_;
  std::optional<RecordReader> reader_;
  std::vector<unsigned char> outgoing_, incoming_;
  std::size_t outgoing_begin_ = 0, outgoing_end_ = 0, incoming_begin_ = 0, incoming_end_ = 0;
  bool sending_ = false;
  asio::error_code read_failure_;  // what ended the incoming records, given to every read after
  std::vector<std::unique_ptr<Flushed>> waiting_for_flush_;
};

}  // namespace cohort::comm::tcp
