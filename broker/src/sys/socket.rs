//! Raw-fd plumbing between socket2, quinn-udp and glommio.
