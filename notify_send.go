package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
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

// notifyTimeout bounds one attempt: connect, send, and the receiver's
// answer (a receiver that accepts the connection and never answers is an
// error after this, not a hang).
const notifyTimeout = 15 * time.Second

// notifyErrorBytes is how much of a receiver's answer an error keeps, as
// notifications.last_error, a destination's last_error and a test's answer
// show it.
const notifyErrorBytes = 200

// notifySenderConfig is what the sender needs from Config.
type notifySenderConfig struct {
	AllowPrivate   bool
	Proxy          string
	TelegramAPIURL string
	RootCAs        *x509.CertPool // nil: the system's; tests set their own
	Timeout        time.Duration
}

func notifySenderConfigOf(cfg Config) notifySenderConfig {
	return notifySenderConfig{
		AllowPrivate:   cfg.NotifyAllowPrivate,
		Proxy:          cfg.NotifyProxy,
		TelegramAPIURL: cfg.TelegramAPIURL,
		Timeout:        notifyTimeout,
	}
}

// notifySender sends one message to one destination: it renders the
// payload for the destination's type, sends it once and says what came of
// it. Retries, throttling and marking a destination broken are its
// callers' (the delivery workers and the API's test endpoint).
type notifySender struct {
	cfg    notifySenderConfig
	client *http.Client
	logger *slog.Logger
}

func newNotifySender(cfg notifySenderConfig, logger *slog.Logger) (*notifySender, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = notifyTimeout
	}
	if cfg.TelegramAPIURL == "" {
		cfg.TelegramAPIURL = "https://api.telegram.org"
	}
	cfg.TelegramAPIURL = strings.TrimRight(cfg.TelegramAPIURL, "/")
	client, err := newNotifyHTTPClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("notifier: %w", err)
	}
	return &notifySender{cfg: cfg, client: client, logger: logger}, nil
}

// Send delivers p to d once. deliveryID is the same on every retry of one
// message (the webhook's X-Playwatch-Delivery).
func (s *notifySender) Send(ctx context.Context, d destination, deliveryID string, p notifyPayload) sendResult {
	start := time.Now()
	var r sendResult
	switch d.Type {
	case "webhook":
		r = s.sendWebhook(ctx, d, deliveryID, p)
	case "slack":
		r = s.sendSlack(ctx, d, p)
	case "discord":
		r = s.sendDiscord(ctx, d, p)
	case "telegram":
		r = s.sendTelegram(ctx, d, p)
	case "email":
		r = s.sendEmail(ctx, d, deliveryID, p)
	default:
		r = sendResult{Permanent: true, Err: fmt.Errorf("destination type %q is not known", d.Type)}
	}
	if r.Err != nil {
		// Whatever the receiver or the network said, no secret of d leaves.
		r.Err = errors.New(scrubSecrets(r.Err.Error(), d))
	}
	s.logger.Debug("notify send", "destination", d.ID, "type", d.Type, "delivery", deliveryID,
		"http_status", r.HTTPStatus, "permanent", r.Permanent, "retry_after", r.RetryAfter,
		"error", errText(r.Err), "took", time.Since(start))
	return r
}

// Test sends a test message to d now: the receiver's HTTP status (0 for
// email) and, when it did not take it, its answer cut to 200 bytes.
func (s *notifySender) Test(ctx context.Context, d destination) (int, error) {
	p := notifyPayload{Event: "test", App: payloadApp{DisplayName: "playwatch"}}
	r := s.Send(ctx, d, "test-"+strconv.FormatInt(time.Now().UnixNano(), 36), p)
	return r.HTTPStatus, r.Err
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// scrubSecrets is what is kept and shown of a failure: every secret of d
// masked, however an error came to quote it (the webhook secret, the bot
// token, the password; a Slack or Discord URL keeps its scheme and host,
// its path is the credential), cut to notifyErrorBytes of whole characters.
func scrubSecrets(s string, d destination) string {
	c := d.Config
	if urlIsSecret(d.Type) && c.URL != "" {
		s = strings.ReplaceAll(s, c.URL, maskURL(c.URL))
		if u, err := url.Parse(c.URL); err == nil && len(u.Path) > 1 {
			s = strings.ReplaceAll(s, u.EscapedPath(), "/****")
			s = strings.ReplaceAll(s, u.Path, "/****")
		}
	}
	for _, sec := range []string{c.Secret, c.BotToken, c.Password} {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, maskedSecret)
		}
	}
	return cutBytes(s, notifyErrorBytes)
}

var errBadReceiverURL = errors.New("the receiver URL is not an http(s) URL with a host")

// post sends the JSON body to target and reads the answer; the caller turns
// it into a sendResult with classifyHTTP.
func (s *notifySender) post(ctx context.Context, target string, body []byte, header http.Header) (*http.Response, []byte, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, nil, errBadReceiverURL // url.Parse errors quote the URL
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return nil, nil, errBadReceiverURL
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "playwatch/"+version)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, nil, notifyTransportError(err, s.cfg.Timeout)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil && resp.StatusCode/100 != 2 {
		return resp, answer, notifyTransportError(err, s.cfg.Timeout)
	}
	return resp, answer, nil
}

// notifyTransportError is a network failure without the URL that *url.Error
// quotes (a Telegram URL holds the bot token, a Slack or Discord path is
// the credential).
func notifyTransportError(err error, timeout time.Duration) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("timeout: no answer within %s", timeout)
	}
	return err
}

// httpResult classifies an HTTP exchange: 2xx delivered; 408, 429 and 5xx
// transient; any other 4xx (and a redirect, never followed) permanent.
func httpResult(resp *http.Response, answer []byte, err error) sendResult {
	if err != nil && resp == nil {
		return sendResult{Permanent: errors.Is(err, errPrivateReceiver) || errors.Is(err, errBadReceiverURL), Err: err}
	}
	r := sendResult{HTTPStatus: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	code := resp.StatusCode
	if code/100 == 2 {
		return r
	}
	text := strings.TrimSpace(string(answer))
	if text == "" {
		text = http.StatusText(code)
	}
	r.Err = fmt.Errorf("HTTP %d: %s", code, text)
	switch {
	case code/100 == 3:
		r.Permanent = true
		r.Err = fmt.Errorf("HTTP %d: the receiver redirects, and the notifier follows no redirect", code)
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests:
	case code/100 == 4:
		r.Permanent = true
	}
	return r
}

// sendWebhook posts the payload with delivery_id, signed when the
// destination has a secret: X-Playwatch-Signature is sha256=hex(HMAC-SHA256
// of timestamp + "." + body), so a receiver can check both the sender and
// the freshness.
func (s *notifySender) sendWebhook(ctx context.Context, d destination, deliveryID string, p notifyPayload) sendResult {
	body, err := json.Marshal(struct {
		DeliveryID string `json:"delivery_id"`
		notifyPayload
	}{deliveryID, p})
	if err != nil {
		return sendResult{Permanent: true, Err: fmt.Errorf("webhook body: %w", err)}
	}
	h := http.Header{}
	h.Set("X-Playwatch-Delivery", deliveryID)
	if d.Config.Secret != "" {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		h.Set("X-Playwatch-Timestamp", ts)
		h.Set("X-Playwatch-Signature", webhookSignature(d.Config.Secret, ts, body))
	}
	return httpResult(s.post(ctx, d.Config.URL, body, h))
}

func webhookSignature(secret, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(timestamp + "."))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// notifyRetrySeconds reads a JSON number of seconds (Discord's retry_after,
// Telegram's parameters.retry_after).
func notifyRetrySeconds(v float64) time.Duration {
	if v <= 0 || v > 86400 {
		return 0
	}
	return time.Duration(v * float64(time.Second))
}

// sendSlack posts to an incoming webhook, which answers 200 "ok", or an
// error word: 404 no_service (deleted), 403 invalid_token, 400
// invalid_payload, 410 channel_is_archived, 429 with Retry-After.
func (s *notifySender) sendSlack(ctx context.Context, d destination, p notifyPayload) sendResult {
	body, err := json.Marshal(renderSlack(buildNotifyMessage(p)))
	if err != nil {
		return sendResult{Permanent: true, Err: fmt.Errorf("slack body: %w", err)}
	}
	return httpResult(s.post(ctx, d.Config.URL, body, nil))
}

// sendDiscord posts to a webhook, which answers 204; a 429 carries both a
// Retry-After header and {"retry_after": seconds} (the more precise one).
func (s *notifySender) sendDiscord(ctx context.Context, d destination, p notifyPayload) sendResult {
	body, err := json.Marshal(renderDiscord(buildNotifyMessage(p), p))
	if err != nil {
		return sendResult{Permanent: true, Err: fmt.Errorf("discord body: %w", err)}
	}
	resp, answer, err := s.post(ctx, d.Config.URL, body, nil)
	r := httpResult(resp, answer, err)
	if r.HTTPStatus == http.StatusTooManyRequests {
		var rl struct {
			RetryAfter float64 `json:"retry_after"`
		}
		if json.Unmarshal(answer, &rl) == nil && rl.RetryAfter > 0 {
			r.RetryAfter = notifyRetrySeconds(rl.RetryAfter)
		}
	}
	return r
}

// sendTelegram calls the Bot API's sendMessage. Its answers are JSON:
// {"ok":true,"result":{...}} or {"ok":false,"error_code":403,
// "description":"Forbidden: bot was blocked by the user"}, a 429 with
// "parameters":{"retry_after":N}. The URL holds the token: no error
// quotes it (post strips it from transport errors, Send scrubs the rest).
func (s *notifySender) sendTelegram(ctx context.Context, d destination, p notifyPayload) sendResult {
	if d.Config.BotToken == "" || d.Config.ChatID == "" {
		return sendResult{Permanent: true, Err: errors.New("telegram destination without bot_token or chat_id")}
	}
	body, err := json.Marshal(map[string]any{
		"chat_id":              d.Config.ChatID,
		"text":                 renderTelegram(buildNotifyMessage(p)),
		"parse_mode":           "HTML",
		"link_preview_options": map[string]bool{"is_disabled": true},
	})
	if err != nil {
		return sendResult{Permanent: true, Err: fmt.Errorf("telegram body: %w", err)}
	}
	resp, answer, err := s.post(ctx, s.cfg.TelegramAPIURL+"/bot"+d.Config.BotToken+"/sendMessage", body, nil)
	r := httpResult(resp, answer, err)
	if resp == nil {
		return r
	}
	var tg struct {
		OK          bool   `json:"ok"`
		Description string `json:"description"`
		Parameters  struct {
			RetryAfter float64 `json:"retry_after"`
		} `json:"parameters"`
	}
	if json.Unmarshal(answer, &tg) != nil {
		return r
	}
	if r.Err == nil && !tg.OK {
		// A 2xx that says it did not send: take its word.
		return sendResult{HTTPStatus: r.HTTPStatus, Err: fmt.Errorf("HTTP %d: %s", r.HTTPStatus, tg.Description)}
	}
	if r.Err != nil && tg.Description != "" {
		r.Err = fmt.Errorf("HTTP %d: %s", r.HTTPStatus, tg.Description)
	}
	if tg.Parameters.RetryAfter > 0 {
		r.RetryAfter = notifyRetrySeconds(tg.Parameters.RetryAfter)
	}
	return r
}
