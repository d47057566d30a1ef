package main

import (
	"net/netip"
	"time"
)

// sendResult is what one attempt to deliver a message came to.
type sendResult struct {
	HTTPStatus int           // the receiver's status; 0 when none answered (or SMTP)
	RetryAfter time.Duration // what the receiver asked for (Retry-After, Telegram's parameters.retry_after); 0: none
	// Permanent: the receiver refused for good (a 4xx other than 408 and
	// 429: a deleted webhook, a bot blocked by the chat, an SMTP 5xx), so the
	// destination is broken until it is PATCHed or tested successfully.
	Permanent bool
	Err       error // nil: delivered (2xx); its text is the receiver's answer cut to 200 bytes, never a secret
}

// isPrivateAddr says whether a receiver at ip is refused unless
// NOTIFY_ALLOW_PRIVATE: loopback, private, link-local, unique-local,
// unspecified (and their IPv4-mapped forms).
func isPrivateAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsUnspecified() || ip.IsInterfaceLocalMulticast()
}
