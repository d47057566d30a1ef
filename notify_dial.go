package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// errPrivateReceiver is why a message to a loopback, private, link-local or
// unique-local receiver was not sent (NOTIFY_ALLOW_PRIVATE is false).
var errPrivateReceiver = errors.New("receiver address is loopback, private, link-local or unique-local; NOTIFY_ALLOW_PRIVATE=true allows it")

// privateAddrError names the refused address (an IP, never a URL path).
type privateAddrError struct{ addr string }

func (e *privateAddrError) Error() string {
	return "refused " + e.addr + ": " + errPrivateReceiver.Error()
}
func (e *privateAddrError) Unwrap() error { return errPrivateReceiver }

// notifyDialer connects to receivers. Without AllowPrivate it checks the
// address it actually connects to, after DNS (net.Dialer.Control runs per
// resolved address), so a public name whose DNS later answers with a
// private address is still refused.
func notifyDialer(cfg notifySenderConfig, checked bool) *net.Dialer {
	d := &net.Dialer{Timeout: min(cfg.Timeout, 10*time.Second), KeepAlive: 30 * time.Second}
	if checked && !cfg.AllowPrivate {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("receiver address %q: %w", address, err)
			}
			if isPrivateAddr(ap.Addr()) {
				return &privateAddrError{addr: ap.Addr().String()}
			}
			return nil
		}
	}
	return d
}

// newNotifyHTTPClient is the client every HTTP channel sends through.
//
// Through NOTIFY_PROXY the connection goes to the proxy (the operator's
// choice, often on loopback), and the proxy resolves the receiver's name:
// the local resolver's answer is not where the proxy connects, and in a
// filtered network it is a lie (Iran answers blocked names with 10.10.34.x).
// So with a proxy only a target that is a literal private IP (or
// "localhost") is refused; the proxy's own egress rules apply to the rest.
//
// Redirects are never followed: a receiver's answer is its answer, and a
// redirect could point anywhere, a private address included.
func newNotifyHTTPClient(cfg notifySenderConfig) (*http.Client, error) {
	var proxyURL *url.URL
	if cfg.Proxy != "" {
		u, err := parseProxyURL(cfg.Proxy)
		if err != nil {
			return nil, err
		}
		proxyURL = u
	}
	transport := &http.Transport{
		DialContext:           notifyDialer(cfg, proxyURL == nil).DialContext,
		TLSClientConfig:       &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   min(cfg.Timeout, 10*time.Second),
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	// No proxy from the environment (HTTPS_PROXY): NOTIFY_PROXY is the one
	// the check below knows about.
	if proxyURL != nil {
		transport.Proxy = func(req *http.Request) (*url.URL, error) {
			if !cfg.AllowPrivate && literalPrivateHost(req.URL.Hostname()) {
				return nil, &privateAddrError{addr: req.URL.Hostname()}
			}
			return proxyURL, nil
		}
	}
	return &http.Client{
		Transport:     transport,
		Timeout:       cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

// literalPrivateHost: a host that is a private IP literal, or localhost.
func literalPrivateHost(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(h, "[]"))
	return err == nil && isPrivateAddr(ip)
}

// dialSMTP connects to a mail server with the same address check as HTTP
// (mail goes direct: NOTIFY_PROXY is for the chat APIs).
func dialSMTP(ctx context.Context, cfg notifySenderConfig, host string, port int) (net.Conn, error) {
	return notifyDialer(cfg, true).DialContext(ctx, "tcp", net.JoinHostPort(host, fmt.Sprint(port)))
}
