#pragma once
// TlsStream: TLS 1.3 over a TCP socket through OpenSSL, with records as large as TLS allows and many of
// them per system call. The records go through a BIO pair whose ring buffers hold kRingBytes each way:
// a write encrypts up to kWriteBatch of its bytes (eight 16 KiB records) and sends them with one socket
// write straight from the ring; a read takes as many bytes as the socket has into the other ring and
// decrypts every whole record there into the caller's buffer. (Asio's ssl::stream moves one record per
// socket call through 17 KiB buffers.) Like the socket, it is used by one thread at a time, with at most one
// read and one write in flight. One sender empties the outgoing ring at a time: a write completes when it
// is empty, and what TLS answers while reading (a key update) leaves with it.
#include <asio.hpp>
#include <asio/ssl.hpp>
#include <openssl/ssl.h>

#include <memory>
#include <utility>
#include <vector>

namespace cohort::comm::tcp {

class TlsStream {
 public:
  using executor_type = asio::ip::tcp::socket::executor_type;

  TlsStream(asio::ip::tcp::socket socket, asio::ssl::context& context);
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
    asio::error_code error;
    for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers) && !error && taken < kWriteBatch;
         ++it) {
      const asio::const_buffer buffer = asio::buffer(asio::const_buffer(*it), kWriteBatch - taken);
      const std::size_t encrypted = encrypt(buffer, error);
      taken += encrypted;
      if (encrypted < buffer.size()) break;  // the ring is full
    }
    // Nothing taken from bytes given: only a ring still full of records could do that, and a write starts
    // with it empty (one write at a time, each completing once it is sent).
    if (!error && taken == 0 && asio::buffer_size(buffers) > 0) error = asio::error::no_buffer_space;
    if (error || outgoing().size() == 0) return complete(std::move(handler), error, taken);
    flush([handler = std::move(handler), taken](const asio::error_code& flushed) mutable { handler(flushed, flushed ? 0 : taken); });
  }

 private:
  static constexpr std::size_t kRingBytes = 512 * 1024;
  // A write encrypts at most this much before its records leave, so that the peer decrypts one batch while
  // this side encrypts the next (2 ranks, 512 KiB-1 MiB: 0.36-0.75 ms in batches of 64-256 KiB, 0.56-1.14 ms
  // encrypting 512 KiB at a time).
  static constexpr std::size_t kWriteBatch = 128 * 1024;
  struct FreeSsl {
    void operator()(SSL* ssl) const { SSL_free(ssl); }
  };
  struct FreeBio {
    void operator()(BIO* bio) const { BIO_free(bio); }
  };

  // Encrypts from `buffer` as much as the outgoing ring holds; returns how many of its bytes.
  std::size_t encrypt(asio::const_buffer buffer, asio::error_code& error);
  // Decrypts whole records into `out`; returns the bytes given, 0 when the ring holds no whole record.
  std::size_t decrypt(asio::mutable_buffer out, asio::error_code& error);
  // What a failed OpenSSL call amounts to: its own error, the peer's close, or none (it waits for bytes).
  asio::error_code failure(int result);
  // Where the next bytes from the socket go, straight into the incoming ring.
  asio::mutable_buffer incoming_space();
  void took_in(std::size_t bytes);
  asio::const_buffer outgoing();
  void sent(std::size_t bytes);

  template <typename Handler>
  void complete(Handler handler, const asio::error_code& error, std::size_t bytes) {
    asio::post(socket_.get_executor(), [handler = std::move(handler), error, bytes]() mutable { handler(error, bytes); });
  }

  // A continuation of a flush, run once the outgoing ring is empty (or sending failed).
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

  // `then(error)` once the outgoing ring is empty; starts sending it unless that is under way.
  template <typename Then>
  void flush(Then then) {
    waiting_for_flush_.push_back(std::make_unique<FlushedThen<Then>>(std::move(then)));
    if (!sending_) send_ring();
  }
  void send_ring() {
    const asio::const_buffer pending = outgoing();
    if (pending.size() == 0) return flushed(asio::error_code());
    sending_ = true;
    socket_.async_write_some(pending, [this](const asio::error_code& error, std::size_t bytes) {
      if (error) return flushed(error);
      sent(bytes);
      send_ring();
    });
  }
  void flushed(const asio::error_code& error) {
    sending_ = false;
    auto waiting = std::exchange(waiting_for_flush_, {});
    for (auto& then : waiting) (*then)(error);
  }

  template <typename Handler>
  void handshake_step(Handler handler) {
    ERR_clear_error();
    const int result = SSL_do_handshake(ssl_.get());
    const asio::error_code error = result == 1 ? asio::error_code() : failure(result);
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
    const std::size_t given = out.size() == 0 ? 0 : decrypt(out, error);
    if (error && outgoing().size() > 0 && !sending_) flush([](const asio::error_code&) {});  // the alert
    if (error || given > 0 || out.size() == 0) return complete(std::move(handler), error, given);
    auto then = [this, out, handler = std::move(handler)](const asio::error_code& failed) mutable {
      if (failed) return handler(failed, 0);
      read_step(out, std::move(handler));
    };
    // What TLS answered while reading leaves, without the read waiting for it: the peer may be waiting for
    // this side to read before it reads in turn. A failure to send shows on the socket's reads as well.
    if (outgoing().size() > 0 && !sending_) flush([](const asio::error_code&) {});
    fill(std::move(then));
  }

  // Reads what the socket has into the incoming ring, then `then(error)`.
  template <typename Then>
  void fill(Then then) {
    const asio::mutable_buffer space = incoming_space();
    if (space.size() == 0)  // a record larger than TLS allows
      return asio::post(socket_.get_executor(), [then = std::move(then)]() mutable { then(asio::error::no_buffer_space); });
    socket_.async_read_some(space, [this, then = std::move(then)](const asio::error_code& error, std::size_t bytes) mutable {
      if (!error) took_in(bytes);
      then(error);
    });
  }

  asio::ip::tcp::socket socket_;
  std::unique_ptr<SSL, FreeSsl> ssl_;
  std::unique_ptr<BIO, FreeBio> network_;  // our end of the pair; SSL owns the other
  bool sending_ = false;
  asio::error_code read_failure_;  // found after decrypting records that came before it
  std::vector<std::unique_ptr<Flushed>> waiting_for_flush_;
};

}  // namespace cohort::comm::tcp
