package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/mail"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// smtpTestServer is scripts/smtp_server.py: aiosmtpd, a real SMTP server.
type smtpTestServer struct {
	port   int
	outdir string
	roots  *x509.CertPool
}

type smtpReceived struct {
	MailFrom string   `json:"mail_from"`
	RcptTos  []string `json:"rcpt_tos"`
	AuthUser *string  `json:"auth_user"`
	TLS      bool     `json:"tls"`
	Data     string   `json:"data"`
}

func smtpPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(py); err == nil && exec.Command(path, "-c", "import aiosmtpd").Run() == nil {
			return path
		}
	}
	skipOrFailUnderCI(t, "python3 with aiosmtpd (Debian: python3-aiosmtpd) is not installed")
	return ""
}

func startSMTPServer(t *testing.T, tlsMode, auth string) *smtpTestServer {
	t.Helper()
	py := smtpPython(t)
	dir := t.TempDir()
	srv := &smtpTestServer{outdir: filepath.Join(dir, "mail")}
	if err := os.Mkdir(srv.outdir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"scripts/smtp_server.py", "--outdir", srv.outdir, "--tls", tlsMode}
	if tlsMode != "none" {
		certPEM, keyPEM, err := newSelfSignedCert([]string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
		if err := os.WriteFile(cert, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		srv.roots = x509.NewCertPool()
		srv.roots.AppendCertsFromPEM(certPEM)
		args = append(args, "--cert", cert, "--key", key)
	}
	if auth != "" {
		args = append(args, "--auth", auth)
	}
	cmd := exec.Command(py, args...)
	cmd.Stderr = t.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- line
		io.Copy(io.Discard, out)
	}()
	select {
	case line := <-ready:
		port, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "ready ")))
		if err != nil {
			t.Fatalf("smtp_server.py: %q", line)
		}
		srv.port = port
	case <-time.After(20 * time.Second):
		t.Fatal("smtp_server.py did not start")
	}
	return srv
}

// received is every message the server took, in order.
func (srv *smtpTestServer) received(t *testing.T) []smtpReceived {
	t.Helper()
	var msgs []smtpReceived
	for i := 1; ; i++ {
		b, err := os.ReadFile(filepath.Join(srv.outdir, strconv.Itoa(i)+".json"))
		if os.IsNotExist(err) {
			return msgs
		}
		if err != nil {
			t.Fatal(err)
		}
		var m smtpReceived
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
}

func (srv *smtpTestServer) destination(tlsMode string) destination {
	return destination{ID: 9, Type: "email", Config: destinationConfig{
		SMTPHost: "127.0.0.1", SMTPPort: srv.port, TLS: tlsMode,
		From: "playwatch <alerts@example.com>", To: []string{"team@example.com", "Ops <ops@example.com>"},
	}}
}

// parseMail reads a received message: its headers (Subject decoded) and
// its text/plain and text/html parts (quoted-printable decoded).
func parseMail(t *testing.T, data string) (mail.Header, string, string, string) {
	t.Helper()
	msg, err := mail.ReadMessage(strings.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	subject, err := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
	if err != nil {
		t.Fatal(err)
	}
	_, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string]string{}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for p := range untilEOF(t, mr.NextPart) {
		b, _ := io.ReadAll(p)
		parts[p.Header.Get("Content-Type")] = strings.ReplaceAll(string(b), "\r\n", "\n")
	}
	return msg.Header, subject, parts["text/plain; charset=utf-8"], parts["text/html; charset=utf-8"]
}

func TestNotifyEmailStartTLS(t *testing.T) {
	srv := startSMTPServer(t, "starttls", "alice:pa55-w0rd")
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true, RootCAs: srv.roots})
	d := srv.destination("starttls")
	d.Config.Username, d.Config.Password = "alice", "pa55-w0rd"
	p := testReviewPayload()
	p.App.DisplayName = "دیوار"
	r := s.Send(context.Background(), d, "77-3", p)
	if r.Err != nil || r.HTTPStatus != 0 {
		t.Fatalf("send: %+v", r)
	}
	msgs := srv.received(t)
	if len(msgs) != 1 {
		t.Fatalf("server took %d messages", len(msgs))
	}
	m := msgs[0]
	if m.MailFrom != "alerts@example.com" || strings.Join(m.RcptTos, ",") != "team@example.com,ops@example.com" ||
		m.AuthUser == nil || *m.AuthUser != "alice" || !m.TLS {
		t.Errorf("envelope: %+v", m)
	}
	h, subject, text, html := parseMail(t, m.Data)
	if h.Get("From") != `"playwatch" <alerts@example.com>` || h.Get("To") != `<team@example.com>, "Ops" <ops@example.com>` || h.Get("X-Playwatch-Delivery") != "77-3" {
		t.Errorf("headers: %v", h)
	}
	if want := "New 1★ review of " + fsi + "دیوار" + pdi + " (ir/fa)"; subject != want {
		t.Errorf("subject %q, want %q (raw %q)", subject, want, h.Get("Subject"))
	}
	if !strings.HasPrefix(h.Get("Subject"), "=?utf-8?q?") {
		t.Errorf("subject not Q-encoded: %q", h.Get("Subject"))
	}
	for _, want := range []string{
		"Sentiment: negative · language: fa", "App version: 11.2.0",
		rlm + rli + p.Review.Text + pdi, "Developer reply:\n" + rlm + rli + p.Review.ReplyText + pdi,
		"Google Play: " + p.Review.URL, "Status page: " + p.Links.StatusPage,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text/plain lacks %q:\n%s", want, text)
		}
	}
	if !strings.Contains(html, `<p dir="auto">`+rlm+rli+"برنامه &lt;بد&gt; &amp; کند است"+pdi+"</p>") ||
		!strings.Contains(html, `<a href="https://play.google.com/store/apps/details?id=org.telegram.messenger&amp;reviewId=gp:AOqpTOE1&amp;hl=fa">Google Play</a>`) {
		t.Errorf("text/html:\n%s", html)
	}

	// A wrong password is the server's 535: permanent, and the error does
	// not show the password.
	d.Config.Password = "wrong-secret"
	r = s.Send(context.Background(), d, "77-4", p)
	if r.Err == nil || !r.Permanent || !strings.Contains(r.Err.Error(), "535") || strings.Contains(r.Err.Error(), "wrong-secret") {
		t.Errorf("wrong password: %+v", r)
	}
	// An unknown mailbox (550) is permanent, a full one (450) transient.
	d.Config.Password = "pa55-w0rd"
	d.Config.To = []string{"reject550@example.com"}
	if r := s.Send(context.Background(), d, "77-5", p); r.Err == nil || !r.Permanent || !strings.Contains(r.Err.Error(), "550 5.1.1 No such user here") {
		t.Errorf("550: %+v", r)
	}
	d.Config.To = []string{"busy450@example.com"}
	if r := s.Send(context.Background(), d, "77-6", p); r.Err == nil || r.Permanent || !strings.Contains(r.Err.Error(), "450") {
		t.Errorf("450: %+v", r)
	}
	// The server's certificate is not trusted without the test's roots.
	s2 := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true})
	if r := s2.Send(context.Background(), srv.destination("starttls"), "77-7", p); r.Err == nil || !strings.Contains(r.Err.Error(), "certificate") {
		t.Errorf("untrusted certificate: %+v", r)
	}
	if n := len(srv.received(t)); n != 1 {
		t.Errorf("server took %d messages, want still 1", n)
	}
}

func TestNotifyEmailImplicitTLS(t *testing.T) {
	srv := startSMTPServer(t, "implicit", "bob:secret-pw")
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true, RootCAs: srv.roots})
	d := srv.destination("implicit")
	d.Config.Username, d.Config.Password = "bob", "secret-pw"
	p := notifyPayload{Event: "crawl_failing", App: payloadApp{PackageName: "com.example.gone", DisplayName: "Gone", Country: "us", Lang: "en"},
		Alert: &payloadAlert{Kind: "crawl_failing", Summary: "the store answers 404 (cause not_found)", StartedAt: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)}}
	if r := s.Send(context.Background(), d, "5", p); r.Err != nil {
		t.Fatalf("send: %+v", r)
	}
	msgs := srv.received(t)
	if len(msgs) != 1 || !msgs[0].TLS {
		t.Fatalf("messages: %+v", msgs)
	}
	_, subject, text, _ := parseMail(t, msgs[0].Data)
	if subject != "Crawl failing: Gone (us/en)" || !strings.Contains(text, "the store answers 404 (cause not_found)") || !strings.Contains(text, "Started: 2026-12-01T08:00:00Z") {
		t.Errorf("subject %q text:\n%s", subject, text)
	}
}

func TestNotifyEmailPlainLoopback(t *testing.T) {
	srv := startSMTPServer(t, "none", "")
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true})
	if code, err := s.Test(context.Background(), srv.destination("none")); code != 0 || err != nil {
		t.Fatalf("test message: %d %v", code, err)
	}
	msgs := srv.received(t)
	if len(msgs) != 1 || msgs[0].TLS {
		t.Fatalf("messages: %+v", msgs)
	}
	if _, subject, _, _ := parseMail(t, msgs[0].Data); subject != "playwatch test message" {
		t.Errorf("subject %q", subject)
	}
	// starttls asked of a server that offers none: refused, nothing sent in clear.
	if r := s.Send(context.Background(), srv.destination("starttls"), "2", testReviewPayload()); r.Err == nil || !r.Permanent || !strings.Contains(r.Err.Error(), "STARTTLS") {
		t.Errorf("no STARTTLS: %+v", r)
	}
	// Without NOTIFY_ALLOW_PRIVATE the loopback server is refused.
	s = newTestNotifySender(t, notifySenderConfig{})
	if r := s.Send(context.Background(), srv.destination("none"), "3", testReviewPayload()); r.Err == nil || !r.Permanent || !strings.Contains(r.Err.Error(), "NOTIFY_ALLOW_PRIVATE") {
		t.Errorf("private: %+v", r)
	}
	if n := len(srv.received(t)); n != 1 {
		t.Errorf("server took %d messages, want 1", n)
	}
}

// A mail server that accepts the connection and never greets: an error
// after the timeout, transient.
func TestNotifyEmailStalled(t *testing.T) {
	ln := silentListener(t)
	s := newTestNotifySender(t, notifySenderConfig{AllowPrivate: true, Timeout: 500 * time.Millisecond})
	d := destination{Type: "email", Config: destinationConfig{SMTPHost: "127.0.0.1", SMTPPort: ln.Addr().(*net.TCPAddr).Port, TLS: "none", From: "a@example.com", To: []string{"b@example.com"}}}
	start := time.Now()
	r := s.Send(context.Background(), d, "1", testReviewPayload())
	if r.Err == nil || r.Permanent || !strings.Contains(r.Err.Error(), "timeout") || time.Since(start) > 3*time.Second {
		t.Errorf("stalled: %+v after %s", r, time.Since(start))
	}
}
