#pragma once
// The options every connected socket of the TCP transport gets.
#include <asio/ip/tcp.hpp>

namespace cohort::comm::tcp {

// No Nagle delay. The kernel sizes the buffers (autotuning, which follows each link's bandwidth-delay
// product), except the send buffer of a link within this host (a loopback peer, or one at this socket's own
// address): kSameHostSendBuffer there keeps the bytes in flight few, so that each is copied out of the
// socket while still in the cache.
void tune_connected(asio::ip::tcp::socket& socket);

// Against fixed 4 MiB buffers both ways, 2 and 4 ranks of 2 cores over loopback, medians of 9-15 alternating
// runs: 1.1-1.5x the allreduce bandwidth from 4 MiB on 2 ranks and 1.2-1.5x from 2 MiB on 4, 1.15x a parameter
// server's push+pull; a fixed receive buffer of 1 MiB lost a third from 8 MiB. The kernel doubles it.
constexpr int kSameHostSendBuffer = 256 << 10;

}  // namespace cohort::comm::tcp
