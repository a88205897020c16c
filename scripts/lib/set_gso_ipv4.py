#!/usr/bin/env python3
"""Set a device's IPv4 GSO/GRO size limits (IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE; Linux >= 6.3,
"BIG TCP"). iproute2 6.1 (Debian 12) sets only gso_max_size/gro_max_size, which the kernel applies to IPv4 only up
to 64 KB, so scripts/cluster --gso-size sends the two attributes itself. Run inside the device's namespace.

  set_gso_ipv4.py SIZE [DEVICE]     # SIZE in bytes; DEVICE defaults to eth0. Exit 1 with the kernel's error.
"""
import errno
import os
import socket
import struct
import sys

RTM_NEWLINK, NLM_F_REQUEST, NLM_F_ACK, NLMSG_ERROR = 16, 1, 4, 2
IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE = 63, 64  # include/uapi/linux/if_link.h


def main() -> int:
    if len(sys.argv) not in (2, 3) or not sys.argv[1].isdigit():
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    size, dev = int(sys.argv[1]), sys.argv[2] if len(sys.argv) == 3 else "eth0"
    index = socket.if_nametoindex(dev)
    attrs = b"".join(struct.pack("HHI", 8, t, size) for t in (IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE))
    body = struct.pack("BxHiII", socket.AF_UNSPEC, 0, index, 0, 0) + attrs  # struct ifinfomsg + attributes
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:  # NETLINK_ROUTE
        s.bind((0, 0))
        s.send(struct.pack("IHHII", 16 + len(body), RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, 1, 0) + body)
        reply = s.recv(65536)
    kind = struct.unpack("H", reply[4:6])[0]
    err = -struct.unpack("i", reply[16:20])[0] if kind == NLMSG_ERROR else 0
    if err:
        print(f"set_gso_ipv4: {dev}: {os.strerror(err)} ({errno.errorcode.get(err, err)}); "
              "IPv4 GSO above 64 KB needs Linux >= 6.3", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
