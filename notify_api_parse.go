package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/mail"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// What the notifier API accepts, field by field; each error names the field.

var destinationTypes = []string{"webhook", "slack", "discord", "telegram", "email"}

// destinationTypeFields are each type's own fields, besides name and type.
var destinationTypeFields = map[string][]string{
	"webhook":  {"url", "secret"},
	"slack":    {"url"},
	"discord":  {"url"},
	"telegram": {"bot_token", "chat_id"},
	"email":    {"smtp_host", "smtp_port", "tls", "username", "password", "from", "to"},
}

var (
	botTokenPattern = regexp.MustCompile(`^[0-9]+:[A-Za-z0-9_-]+$`)
	chatIDPattern   = regexp.MustCompile(`^(-?[0-9]{1,20}|@[A-Za-z][A-Za-z0-9_]{3,31})$`)
	smtpHostPattern = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`)
)

const (
	maxURLLength        = 2048
	maxSecretLength     = 1000
	maxRecipients       = 50
	defaultMaxPerHour   = 20
	maxMaxPerHour       = 10000
	maxBackfill         = 30 * 24 * time.Hour
	maxKeywords         = 20
	maxKeywordChars     = 100
	maxRuleDestinations = 100
	maxRuleApps         = 100 // 100 package names stay well under the 64 KiB body
	maxChatID           = 999999999999999
)

// readOnlyFields are in every answer and cannot be written: a POST that
// sends one is refused, a PATCH ignores them, so that a GET's body can be
// changed and sent back.
var readOnlyFields = []string{"id", "status", "last_error", "created_at", "updated_at"}

// decodeString reads a string member; null is refused unless nullable,
// then it is "" (cleared).
func decodeString(field string, v json.RawMessage, nullable bool, maxChars int) (string, error) {
	if string(v) == "null" {
		if nullable {
			return "", nil
		}
		return "", fmt.Errorf("%s must be a string, not null", field)
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("%s has the wrong type: want a string", field)
	}
	return s, validateText(field, &s, maxChars)
}

// parseDestinationFields applies a POST (create) or PATCH body to d. A
// secret sent back as it is masked keeps the stored one.
func parseDestinationFields(d *destination, members map[string]json.RawMessage, create bool) error {
	if create {
		v, ok := members["type"]
		if !ok {
			return fmt.Errorf("type is required: one of %s", strings.Join(destinationTypes, ", "))
		}
		typ, err := decodeString("type", v, false, 20)
		if err != nil {
			return err
		}
		if !slices.Contains(destinationTypes, typ) {
			return fmt.Errorf("type must be one of %s", strings.Join(destinationTypes, ", "))
		}
		d.Type = typ
		if _, ok := members["name"]; !ok {
			return errors.New("name is required")
		}
	}
	own := destinationTypeFields[d.Type]
	c := &d.Config
	for field, v := range members {
		var err error
		switch {
		case field == "type":
			if !create {
				var typ string
				if json.Unmarshal(v, &typ) != nil || typ != d.Type {
					err = errors.New("type cannot be changed: create a new destination")
				}
			}
		case field == "name":
			d.Name, err = decodeString(field, v, false, 255)
			if err == nil && d.Name == "" {
				err = errors.New("name must not be empty")
			}
		case slices.Contains(readOnlyFields, field):
			if create {
				err = fmt.Errorf("%s cannot be written", field)
			}
		case !slices.Contains(own, field):
			known := false
			for _, fields := range destinationTypeFields {
				known = known || slices.Contains(fields, field)
			}
			if known {
				err = fmt.Errorf("%s is not a field of a %s destination (its fields: name, %s)", field, d.Type, strings.Join(own, ", "))
			} else {
				err = fmt.Errorf("unknown field %q (a %s destination has: name, type, %s)", field, d.Type, strings.Join(own, ", "))
			}
		case field == "url":
			var u string
			if u, err = decodeString(field, v, false, maxURLLength); err == nil {
				if !(urlIsSecret(d.Type) && !create && c.URL != "" && u == maskURL(c.URL)) {
					c.URL = u
				}
			}
		case field == "secret":
			err = decodeSecret(field, v, true, create, &c.Secret)
		case field == "bot_token":
			err = decodeSecret(field, v, false, create, &c.BotToken)
		case field == "password":
			err = decodeSecret(field, v, true, create, &c.Password)
		case field == "chat_id":
			// Telegram's chat ids are numbers; a JSON number is taken as its digits.
			if n, ok := jsonInt(v); ok {
				if n < -maxChatID || n > maxChatID {
					err = fmt.Errorf("chat_id must be a number from %d to %d, or a string", -maxChatID, maxChatID)
				}
				c.ChatID = strconv.FormatInt(n, 10)
			} else if string(v) != "" && v[0] != '"' && string(v) != "null" {
				err = errors.New("chat_id must be an integer or a string")
			} else {
				c.ChatID, err = decodeString(field, v, false, 40)
			}
		case field == "smtp_host":
			c.SMTPHost, err = decodeString(field, v, false, 253)
		case field == "smtp_port":
			var p *int
			if err = decodeIntRange(field, v, 1, 65535, &p); err == nil {
				c.SMTPPort = *p
			}
		case field == "tls":
			c.TLS, err = decodeString(field, v, false, 20)
		case field == "username":
			c.Username, err = decodeString(field, v, true, 255)
		case field == "from":
			c.From, err = decodeString(field, v, false, 320)
		case field == "to":
			var to []string
			if err = decodeField(field, v, &to, "a list of e-mail addresses"); err == nil {
				c.To = to
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decodeSecret reads a write-only field: its mask keeps what is stored
// (on a PATCH), null clears it when it is optional.
func decodeSecret(field string, v json.RawMessage, optional, create bool, dst *string) error {
	s, err := decodeString(field, v, optional, maxSecretLength)
	if err != nil {
		return err
	}
	if s == "" && string(v) != "null" {
		return fmt.Errorf("%s must not be empty (null removes an optional one)", field)
	}
	if s == maskedSecret {
		if create {
			return fmt.Errorf("%s: send the secret itself, not its mask", field)
		}
		return nil
	}
	*dst = s
	return nil
}

// checkDestination checks that d has what its type needs, and fills the
// defaults of an e-mail destination (tls starttls, the port of its tls).
func checkDestination(d *destination, allowPrivate bool) error {
	c := &d.Config
	switch d.Type {
	case "webhook", "slack", "discord":
		if c.URL == "" {
			return fmt.Errorf("url is required for a %s destination", d.Type)
		}
		return checkReceiverURL(c.URL, allowPrivate)
	case "telegram":
		if c.BotToken == "" {
			return errors.New("bot_token is required for a telegram destination")
		}
		if !botTokenPattern.MatchString(c.BotToken) {
			return errors.New("bot_token is not a Telegram bot token (digits, a colon, then letters, digits, _ and -)")
		}
		if c.ChatID == "" {
			return errors.New("chat_id is required for a telegram destination")
		}
		if !chatIDPattern.MatchString(c.ChatID) {
			return errors.New("chat_id must be a chat's number (e.g. -1001234567890) or a channel's @username")
		}
	case "email":
		return checkEmail(c, allowPrivate)
	}
	return nil
}

func checkEmail(c *destinationConfig, allowPrivate bool) error {
	if c.SMTPHost == "" {
		return errors.New("smtp_host is required for an email destination")
	}
	ip, ipErr := netip.ParseAddr(c.SMTPHost)
	if ipErr != nil && !smtpHostPattern.MatchString(c.SMTPHost) {
		return errors.New("smtp_host must be a host name or an IP address, without scheme or port")
	}
	if ipErr == nil && isPrivateAddr(ip) && !allowPrivate {
		return errors.New("smtp_host is a loopback, private, link-local or unique-local address; set NOTIFY_ALLOW_PRIVATE=true to send there")
	}
	if c.TLS == "" {
		c.TLS = "starttls"
	}
	port, ok := smtpDefaultPorts[c.TLS]
	if !ok {
		return errors.New("tls must be starttls, implicit or none")
	}
	if c.TLS == "none" && !(strings.EqualFold(strings.TrimSuffix(c.SMTPHost, "."), "localhost") || (ipErr == nil && ip.Unmap().IsLoopback())) {
		return errors.New("tls none is only for an SMTP server on loopback (localhost, 127.0.0.1, ::1): the password and the mail would cross the network in clear")
	}
	if c.SMTPPort == 0 {
		c.SMTPPort = port
	}
	if c.From == "" {
		return errors.New("from is required for an email destination")
	}
	if _, err := mail.ParseAddress(c.From); err != nil {
		return errors.New("from is not an e-mail address")
	}
	if len(c.To) == 0 || len(c.To) > maxRecipients {
		return fmt.Errorf("to must list 1 to %d e-mail addresses", maxRecipients)
	}
	for i, a := range c.To {
		if err := validateText("to", &a, 320); err != nil {
			return err
		}
		if _, err := mail.ParseAddress(a); err != nil {
			return fmt.Errorf("to[%d] is not an e-mail address", i)
		}
	}
	return nil
}

// checkReceiverURL: http(s), with a host, without user info; a literal
// private address only with NOTIFY_ALLOW_PRIVATE (a host name is resolved
// and checked when a message is sent, so DNS cannot switch it). The URL is
// never quoted: a Slack or Discord URL is a credential.
func checkReceiverURL(raw string, allowPrivate bool) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("url is not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("url must be an http or https URL")
	}
	if u.User != nil {
		return errors.New("url must not hold user info (user:password@)")
	}
	if u.Hostname() == "" {
		return errors.New("url has no host")
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil && isPrivateAddr(ip) && !allowPrivate {
		return errors.New("url is at a loopback, private, link-local or unique-local address; set NOTIFY_ALLOW_PRIVATE=true to send there")
	}
	return nil
}

// --- rules ---

var notifyEvents = []string{"review", "rating_drop", "negative_spike", "crawl_failing", "new_version"}

// eventFilterFields are the filter fields each event reads.
var eventFilterFields = map[string][]string{
	"review":         {"max_stars", "sentiment", "text_lang", "keywords", "min_length", "storefronts"},
	"rating_drop":    {"min_drop", "window", "storefronts"},
	"negative_spike": {"min_count", "factor", "storefronts"},
	"crawl_failing":  {"storefronts"},
	"new_version":    {"storefronts"},
}

// parseRuleFields applies a POST (create) or PATCH body to rule, then
// checks that its filter is one of its event's.
func parseRuleFields(rule *notifyRule, members map[string]json.RawMessage, create bool) error {
	if create {
		for _, f := range []string{"name", "event", "destinations"} {
			if _, ok := members[f]; !ok {
				return fmt.Errorf("%s is required", f)
			}
		}
	}
	for field, v := range members {
		var err error
		switch field {
		case "name":
			rule.Name, err = decodeString(field, v, false, 255)
			if err == nil && rule.Name == "" {
				err = errors.New("name must not be empty")
			}
		case "event":
			rule.Event, err = decodeString(field, v, false, 20)
			if err == nil && !slices.Contains(notifyEvents, rule.Event) {
				err = fmt.Errorf("event must be one of %s", strings.Join(notifyEvents, ", "))
			}
		case "destinations":
			var raw []json.RawMessage
			if decodeField(field, v, &raw, "") != nil || string(v) == "null" {
				err = errors.New("destinations must be a list of destination ids")
				break
			}
			ids := make([]int64, len(raw))
			for i, r := range raw {
				var ok bool
				if ids[i], ok = jsonInt(r); !ok {
					ids[i] = -1
				}
			}
			if len(ids) == 0 || len(ids) > maxRuleDestinations {
				err = fmt.Errorf("destinations must name 1 to %d destinations", maxRuleDestinations)
				break
			}
			rule.Destinations = nil
			for _, id := range ids {
				if id < 1 {
					err = errors.New("destinations must be a list of destination ids (positive integers)")
				} else if !slices.Contains(rule.Destinations, id) {
					rule.Destinations = append(rule.Destinations, id)
				}
			}
		case "apps":
			err = decodeApps(v, rule)
		case "filter":
			rule.Filter, err = parseFilter(v)
		case "max_per_hour":
			var n *int
			if err = decodeIntRange(field, v, 0, maxMaxPerHour, &n); err == nil {
				rule.MaxPerHour = *n
			}
		case "backfill":
			var s string
			if s, err = decodeString(field, v, true, 40); err == nil && string(v) != "null" {
				d, perr := parseDuration(s)
				if perr != nil || d < 0 || d > maxBackfill {
					err = errors.New("backfill must be a duration from 0s to 30d, such as 24h or 7d")
				}
				rule.Backfill = d
			} else if err == nil {
				rule.Backfill = 0
			}
		case "id", "created_at", "updated_at":
			if create { // a PATCH may send a GET's body back
				err = fmt.Errorf("%s cannot be written", field)
			}
		default:
			err = fmt.Errorf("unknown field %q (known: name, event, destinations, apps, filter, max_per_hour, backfill)", field)
		}
		if err != nil {
			return err
		}
	}
	own := eventFilterFields[rule.Event]
	for _, f := range filterFieldsSet(rule.Filter) {
		if !slices.Contains(own, f) {
			if len(own) == 0 {
				return fmt.Errorf("filter.%s does not belong to event %s, which takes no filter", f, rule.Event)
			}
			return fmt.Errorf("filter.%s does not belong to event %s (its filter fields: %s)", f, rule.Event, strings.Join(own, ", "))
		}
	}
	return nil
}

func decodeApps(v json.RawMessage, rule *notifyRule) error {
	if string(v) == "null" {
		rule.Apps = nil
		return nil
	}
	var apps []string
	if err := decodeField("apps", v, &apps, "a list of package names or null"); err != nil {
		return err
	}
	if len(apps) == 0 || len(apps) > maxRuleApps {
		return fmt.Errorf("apps must list 1 to %d package names, or be null (every active app)", maxRuleApps)
	}
	rule.Apps = nil
	for _, pkg := range apps {
		if err := validatePackageName(pkg); err != nil {
			return fmt.Errorf("apps: %w", err)
		}
		if !slices.Contains(rule.Apps, pkg) {
			rule.Apps = append(rule.Apps, pkg)
		}
	}
	return nil
}

// filterFieldsSet lists the fields f gives.
func filterFieldsSet(f ruleFilter) []string {
	var out []string
	add := func(name string, set bool) {
		if set {
			out = append(out, name)
		}
	}
	add("max_stars", f.MaxStars != nil)
	add("sentiment", len(f.Sentiment) > 0)
	add("text_lang", len(f.TextLang) > 0)
	add("keywords", len(f.Keywords) > 0)
	add("min_length", f.MinLength != nil)
	add("min_drop", f.MinDrop != nil)
	add("window", f.Window != "")
	add("min_count", f.MinCount != nil)
	add("factor", f.Factor != nil)
	add("storefronts", len(f.Storefronts) > 0)
	return out
}

// parseFilter reads a rule's filter object; null is no filter. A field
// given as null is not given.
func parseFilter(v json.RawMessage) (ruleFilter, error) {
	var f ruleFilter
	if string(v) == "null" {
		return f, nil
	}
	members, err := objectMembers(v)
	if err != nil {
		return f, errors.New("filter must be a JSON object")
	}
	for field, v := range members {
		name := "filter." + field
		if string(v) == "null" {
			continue
		}
		switch field {
		case "max_stars":
			err = decodeIntRange(name, v, 1, 5, &f.MaxStars)
		case "min_length":
			err = decodeIntRange(name, v, 0, 100000, &f.MinLength)
		case "min_count":
			err = decodeIntRange(name, v, 1, 1000000, &f.MinCount)
		case "sentiment":
			f.Sentiment, err = decodeEnumList(name, v, []string{"POSITIVE", "NEUTRAL", "NEGATIVE"})
		case "text_lang":
			f.TextLang, err = decodeEnumList(name, v, []string{"fa", "en", "other"})
		case "keywords":
			var kws []string
			if decodeField(name, v, &kws, "") != nil || len(kws) == 0 || len(kws) > maxKeywords {
				err = fmt.Errorf("%s must be a list of 1 to %d strings", name, maxKeywords)
				break
			}
			for _, kw := range kws {
				if strings.TrimSpace(kw) == "" || !utf8.ValidString(kw) || strings.ContainsRune(kw, 0) || utf8.RuneCountInString(kw) > maxKeywordChars {
					err = fmt.Errorf("%s: each keyword must be a non-empty string of at most %d characters", name, maxKeywordChars)
					break
				}
			}
			f.Keywords = kws
		case "min_drop":
			err = decodePositive(name, v, 5, &f.MinDrop)
		case "factor":
			err = decodePositive(name, v, 1000, &f.Factor)
		case "window":
			var s string
			if s, err = decodeString(name, v, false, 40); err == nil {
				d, perr := parseDuration(s)
				if perr != nil || d <= 0 || d > maxBackfill {
					err = fmt.Errorf("%s must be a duration from 1s to 30d, such as 24h or 7d", name)
				}
				f.Window = s
			}
		case "storefronts":
			f.Storefronts, err = decodeStorefronts(name, v)
		default:
			err = fmt.Errorf("%s is not a filter field (every event: storefronts; review: max_stars, sentiment, text_lang, keywords, min_length; rating_drop: min_drop, window; negative_spike: min_count, factor)", name)
		}
		if err != nil {
			return f, err
		}
	}
	return f, nil
}

func decodeIntRange(name string, v json.RawMessage, lo, hi int, dst **int) error {
	n, ok := jsonInt(v)
	if !ok || n < int64(lo) || n > int64(hi) {
		return fmt.Errorf("%s must be an integer from %d to %d", name, lo, hi)
	}
	i := int(n)
	*dst = &i
	return nil
}

// jsonInt reads a JSON number that is an integer, also when written with a
// fraction or exponent (18537.0, 1e3), as JSON Schema counts them.
func jsonInt(v json.RawMessage) (int64, bool) {
	var num json.Number
	if json.Unmarshal(v, &num) != nil || string(v) == "null" || strings.HasPrefix(strings.TrimSpace(string(v)), `"`) {
		return 0, false
	}
	if n, err := num.Int64(); err == nil {
		return n, true
	}
	f, err := num.Float64()
	if err != nil || f != math.Trunc(f) || math.Abs(f) >= 1<<63 {
		return 0, false
	}
	return int64(f), true
}

func decodePositive(name string, v json.RawMessage, hi float64, dst **float64) error {
	var x float64
	if json.Unmarshal(v, &x) != nil || x <= 0 || x > hi {
		return fmt.Errorf("%s must be a number above 0 and at most %g", name, hi)
	}
	*dst = &x
	return nil
}

func decodeEnumList(name string, v json.RawMessage, allowed []string) ([]string, error) {
	var vals []string
	if json.Unmarshal(v, &vals) != nil || len(vals) == 0 {
		return nil, fmt.Errorf("%s must be a non-empty list of %s", name, strings.Join(allowed, ", "))
	}
	var out []string
	for _, s := range vals {
		if !slices.Contains(allowed, s) {
			return nil, fmt.Errorf("%s must be a non-empty list of %s", name, strings.Join(allowed, ", "))
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}
