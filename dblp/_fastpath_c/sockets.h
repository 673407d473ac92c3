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
ssize_t recv_gro(int fd, struct iovec *iov, size_t iovlen, struct sockaddr_storage *src, Py_ssize_t *seg);

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

/* A datagram's source as one integer: (IPv4 address << 16) | port (also for an IPv4-mapped IPv6
 * address); for IPv6, bit 62 set and 62 bits of FNV-1a over address and port (dblp.udp.addr_key
 * computes the same). A collision could only make a foreign source look like the peer, whose
 * datagrams still pass every other check of R4 (the run's tag on the authenticated wire). */
static inline int64_t src_key(const struct sockaddr_storage *a) {
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)a;
        const uint8_t *b = s6->sin6_addr.s6_addr;
        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
            return ((int64_t)get_be32(b + 12) << 16) | ntohs(s6->sin6_port);
        uint64_t h = 1469598103934665603ULL;
        for (int i = 0; i < 16; i++) h = (h ^ b[i]) * 1099511628211ULL;
        uint16_t port = ntohs(s6->sin6_port);
        h = (h ^ (port >> 8)) * 1099511628211ULL;
        h = (h ^ (port & 0xFF)) * 1099511628211ULL;
        return (int64_t)((h & ((1ULL << 62) - 1)) | (1ULL << 62));
    }
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)a;
    return ((int64_t)ntohl(s4->sin_addr.s_addr) << 16) | ntohs(s4->sin_port);
}

#endif
