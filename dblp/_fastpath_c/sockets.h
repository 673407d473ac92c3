/* What the socket loops share (sockets.c, place.c): the UDP GSO/GRO
 * constants older headers lack, one GRO-aware receive call and the key of
 * a datagram's source. */
#ifndef DBLP_FASTPATH_SOCKETS_H
#define DBLP_FASTPATH_SOCKETS_H

#include "common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#define MMSG_BATCH 256 /* datagrams per recvmmsg */

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden)
#endif

/* One non-blocking recvmsg into iov, with room for the UDP_GRO control message; *seg gets the
 * segment size of a coalesced run (n itself for a single datagram). */
ssize_t recv_gro(int fd, struct iovec *iov, size_t iovlen, struct sockaddr_in *src, Py_ssize_t *seg);

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

/* A datagram's source as one integer: (IPv4 address << 16) | port. */
static inline int64_t src_key(const struct sockaddr_in *a) {
    return ((int64_t)ntohl(a->sin_addr.s_addr) << 16) | ntohs(a->sin_port);
}

#endif
