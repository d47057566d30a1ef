package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/netip"
	"net/smtp"
	"net/textproto"
	"strings"
	"time"
)

// smtpDefaultPorts is the port of each tls mode when smtp_port is not set.
var smtpDefaultPorts = map[string]int{"starttls": 587, "implicit": 465, "none": 25}

// sendEmail sends one message over SMTP: tls starttls (port 587 by
// default), implicit (465) or none (25; only to a mail server on
// loopback, so nothing crosses a network in clear), AUTH PLAIN when a
// username is set. An SMTP 5xx is permanent, a 4xx transient.
func (s *notifySender) sendEmail(ctx context.Context, d destination, deliveryID string, p notifyPayload) sendResult {
	c := d.Config
	from, err := mail.ParseAddress(c.From)
	if err != nil {
		return sendResult{Permanent: true, Err: fmt.Errorf("email from %q: %w", c.From, err)}
	}
	if len(c.To) == 0 {
		return sendResult{Permanent: true, Err: errors.New("email destination without to")}
	}
	var to []*mail.Address
	for _, t := range c.To {
		a, err := mail.ParseAddress(t)
		if err != nil {
			return sendResult{Permanent: true, Err: fmt.Errorf("email to %q: %w", t, err)}
		}
		to = append(to, a)
	}
	port := c.SMTPPort
	if port == 0 {
		port = smtpDefaultPorts[c.TLS]
	}
	if c.SMTPHost == "" || port == 0 {
		return sendResult{Permanent: true, Err: fmt.Errorf("email destination: smtp_host %q, smtp_port %d, tls %q", c.SMTPHost, c.SMTPPort, c.TLS)}
	}
	msg, err := buildEmail(from, to, deliveryID, buildNotifyMessage(p))
	if err != nil {
		return sendResult{Permanent: true, Err: err}
	}

	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	conn, err := dialSMTP(ctx, s.cfg, c.SMTPHost, port)
	if err != nil {
		return sendResult{Permanent: errors.Is(err, errPrivateReceiver), Err: notifyTransportError(err, s.cfg.Timeout)}
	}
	defer conn.Close()
	// One deadline for the whole exchange: a server that accepts and never
	// answers is an error, not a hang.
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return sendResult{Err: err}
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) }) // caller's cancel
	defer stop()

	tlsConfig := &tls.Config{ServerName: c.SMTPHost, RootCAs: s.cfg.RootCAs, MinVersion: tls.VersionTLS12}
	switch c.TLS {
	case "implicit":
		conn = tls.Client(conn, tlsConfig)
	case "starttls":
	case "none":
		if ap, err := netip.ParseAddrPort(conn.RemoteAddr().String()); err != nil || !ap.Addr().Unmap().IsLoopback() {
			return sendResult{Permanent: true, Err: errors.New("tls none is allowed only to a mail server on loopback")}
		}
	default:
		return sendResult{Permanent: true, Err: fmt.Errorf("email tls %q: must be starttls, implicit or none", c.TLS)}
	}
	r := smtpExchange(conn, c, tlsConfig, from, to, msg)
	if r.Err != nil {
		r.Err = notifyTransportError(r.Err, s.cfg.Timeout)
	}
	return r
}

// smtpExchange runs the SMTP dialogue on conn.
func smtpExchange(conn net.Conn, c destinationConfig, tlsConfig *tls.Config, from *mail.Address, to []*mail.Address, msg []byte) sendResult {
	fail := func(stage string, err error) sendResult {
		var te *textproto.Error
		if errors.As(err, &te) {
			return sendResult{Permanent: te.Code >= 500, Err: fmt.Errorf("SMTP %s: %d %s", stage, te.Code, te.Msg)}
		}
		return sendResult{Err: fmt.Errorf("SMTP %s: %w", stage, err)}
	}
	cl, err := smtp.NewClient(conn, c.SMTPHost)
	if err != nil {
		return fail("greeting", err)
	}
	defer cl.Close()
	if err := cl.Hello("playwatch.localhost"); err != nil {
		return fail("EHLO", err)
	}
	if c.TLS == "starttls" {
		if ok, _ := cl.Extension("STARTTLS"); !ok {
			return sendResult{Permanent: true, Err: errors.New("SMTP: the server offers no STARTTLS (tls starttls)")}
		}
		if err := cl.StartTLS(tlsConfig); err != nil {
			return fail("STARTTLS", err)
		}
	}
	if c.Username != "" {
		if ok, _ := cl.Extension("AUTH"); !ok {
			return sendResult{Permanent: true, Err: errors.New("SMTP: the server offers no AUTH, and a username is set")}
		}
		// smtp.PlainAuth sends the password only over TLS or to localhost.
		if err := cl.Auth(smtp.PlainAuth("", c.Username, c.Password, c.SMTPHost)); err != nil {
			return fail("AUTH", err)
		}
	}
	if err := cl.Mail(from.Address); err != nil {
		return fail("MAIL FROM", err)
	}
	for _, a := range to {
		if err := cl.Rcpt(a.Address); err != nil {
			return fail("RCPT TO <"+a.Address+">", err)
		}
	}
	w, err := cl.Data()
	if err != nil {
		return fail("DATA", err)
	}
	if _, err := w.Write(msg); err != nil {
		return fail("DATA", err)
	}
	if err := w.Close(); err != nil {
		return fail("DATA", err)
	}
	// The server took the message (250 after DATA): a lost QUIT is no
	// reason to send it again.
	_ = cl.Quit()
	return sendResult{}
}

// buildEmail is the RFC 5322 message: a Q-encoded UTF-8 Subject (Persian
// app names), text/plain and text/html alternatives, quoted-printable.
func buildEmail(from *mail.Address, to []*mail.Address, deliveryID string, m notifyMessage) ([]byte, error) {
	subject, text, htmlBody := renderEmail(m)
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, part := range []struct{ typ, content string }{{"text/plain", text}, {"text/html", htmlBody}} {
		pw, err := mw.CreatePart(textproto.MIMEHeader{
			"Content-Type":              {part.typ + "; charset=utf-8"},
			"Content-Transfer-Encoding": {"quoted-printable"},
		})
		if err != nil {
			return nil, fmt.Errorf("email body: %w", err)
		}
		qp := quotedprintable.NewWriter(pw)
		if _, err := qp.Write([]byte(part.content)); err != nil {
			return nil, fmt.Errorf("email body: %w", err)
		}
		if err := qp.Close(); err != nil {
			return nil, fmt.Errorf("email body: %w", err)
		}
	}
	if err := mw.Close(); err != nil {
		return nil, fmt.Errorf("email body: %w", err)
	}
	var tos []string
	for _, a := range to {
		tos = append(tos, a.String())
	}
	id := strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '-' || r == '.' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return -1
	}, deliveryID)
	var msg bytes.Buffer
	fmt.Fprintf(&msg, "From: %s\r\n", from.String())
	fmt.Fprintf(&msg, "To: %s\r\n", strings.Join(tos, ", "))
	fmt.Fprintf(&msg, "Subject: %s\r\n", mime.QEncoding.Encode("utf-8", subject))
	fmt.Fprintf(&msg, "Date: %s\r\n", time.Now().UTC().Format(time.RFC1123Z))
	fmt.Fprintf(&msg, "Message-ID: <%s.%d@playwatch>\r\n", id, time.Now().UnixNano())
	fmt.Fprintf(&msg, "X-Playwatch-Delivery: %s\r\n", id)
	fmt.Fprintf(&msg, "MIME-Version: 1.0\r\n")
	fmt.Fprintf(&msg, "Content-Type: multipart/alternative; boundary=%s\r\n\r\n", mw.Boundary())
	msg.Write(body.Bytes())
	return msg.Bytes(), nil
}
