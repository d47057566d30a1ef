package main

import (
	"cmp"
	"fmt"
	"html"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
)

// Channel limits (issue §6); counted in UTF-16 units, which is what the
// APIs count or more (an emoji is two), so a cut text always fits.
const (
	slackBlockLimit     = 3000
	discordContentLimit = 2000
	telegramTextLimit   = 4096
)

// notifyMessage is a payload said in words, before any channel's markup.
// Every string is plain text with its bidi marks already placed (see
// bidiParagraph); the renderers escape it for their markup.
type notifyMessage struct {
	Title string   // one line: what happened, to which app and storefront
	Facts []string // short lines: stars, sentiment and language, version, values, times
	Text  string   // the review's text or the alert's summary (may be many lines); cut to fit
	Reply string   // the developer's reply, if any; cut to fit
	Links []notifyLink
}

type notifyLink struct{ Label, URL string }

// Persian (and any right-to-left) text must read right to left in clients
// that lay every message out left to right (Slack, Discord's web client)
// as well as in those that pick a paragraph's direction from its first
// strong letter (Telegram, mail clients with dir=auto). A paragraph whose
// first strong letter is right-to-left therefore starts with RLM (U+200F:
// a strong RTL mark, which the pickers see first) and is wrapped in RLI
// ... PDI (U+2067, U+2069: an isolate, so an LTR layout still orders the
// run right to left and keeps its punctuation and numbers in place). A
// name inside an LTR line ("New review of دیوار") is wrapped in FSI ...
// PDI (U+2068) so it neither takes nor lends direction. Pure LTR text is
// left as it is.
const (
	rlm = "\u200f"
	rli = "\u2067"
	fsi = "\u2068"
	pdi = "\u2069"
)

// firstStrongRTL says whether the first letter of s with a strong
// direction is right to left.
func firstStrongRTL(s string) bool {
	for _, r := range s {
		if isRTLRune(r) {
			return true
		}
		if unicode.IsLetter(r) {
			return false
		}
	}
	return false
}

func isRTLRune(r rune) bool {
	return unicode.In(r, unicode.Arabic, unicode.Hebrew, unicode.Syriac, unicode.Thaana, unicode.Nko)
}

func hasRTL(s string) bool { return strings.IndexFunc(s, isRTLRune) >= 0 }

// bidiParagraph marks one paragraph (no newline inside) of user text.
func bidiParagraph(p string) string {
	if !firstStrongRTL(p) {
		return p
	}
	return rlm + rli + p + pdi
}

// bidiInline isolates a name used inside a sentence.
func bidiInline(s string) string {
	if !hasRTL(s) {
		return s
	}
	return fsi + s + pdi
}

// oneLine flattens user text that must stay on one line (names).
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func stars(n int) string {
	n = max(0, min(5, n))
	return strings.Repeat("★", n) + strings.Repeat("☆", 5-n)
}

// buildNotifyMessage says p in words (issue §6).
func buildNotifyMessage(p notifyPayload) notifyMessage {
	app := oneLine(p.App.DisplayName)
	if app == "" {
		app = p.App.PackageName
	}
	appLabel := bidiInline(app)
	if p.App.Country != "" || p.App.Lang != "" {
		appLabel += " (" + strings.Trim(p.App.Country+"/"+p.App.Lang, "/") + ")"
	}
	var m notifyMessage
	link := func(label, url string) {
		if url != "" {
			m.Links = append(m.Links, notifyLink{label, url})
		}
	}
	switch {
	case p.Event == "test":
		m.Title = "playwatch test message"
		m.Text = "This destination works: playwatch can deliver notifications to it."
	case p.Event == "digest" && p.Digest != nil:
		of := appLabel
		if len(p.Digest.Apps) > 1 {
			of = fmt.Sprintf("%d apps", len(p.Digest.Apps))
		}
		m.Title = fmt.Sprintf("and %d more %s of %s in the last hour", p.Digest.Count, digestNoun(p.Digest.Of, p.Digest.Count), of)
		m.Facts = []string{"The rule's max_per_hour held these back; this digest stands for them."}
		if len(p.Digest.Apps) > 1 {
			counts := make([]string, len(p.Digest.Apps))
			for i, a := range p.Digest.Apps {
				counts[i] = fmt.Sprintf("%s: %d", bidiInline(cmp.Or(a.DisplayName, a.PackageName)), a.Count)
			}
			m.Facts = append(m.Facts, strings.Join(counts, " · "))
		}
		link("Status page", p.Links.StatusPage)
		link("Google Play", p.Links.Play)
	case p.Review != nil:
		r := p.Review
		m.Title = fmt.Sprintf("New %d★ review of %s", r.Stars, appLabel)
		sentiment := sentimentLabel(r.Sentiment)
		if sentiment == "" {
			sentiment = "not labelled"
		}
		if r.SentimentFromStars {
			sentiment += " (from stars)"
		}
		facts := stars(r.Stars) + " · Sentiment: " + sentiment
		if r.TextLang != "" {
			facts += " · language: " + r.TextLang
		}
		m.Facts = append(m.Facts, facts)
		if r.AppVersion != "" {
			m.Facts = append(m.Facts, "App version: "+oneLine(r.AppVersion))
		}
		by := "By " + bidiInline(oneLine(r.UserName))
		if r.UserName == "" {
			by = "By an unnamed user"
		}
		if !r.At.IsZero() {
			by += " · " + r.At.UTC().Format("2006-01-02 15:04 UTC")
		}
		m.Facts = append(m.Facts, by)
		m.Text = r.Text
		m.Reply = r.ReplyText
		// The review itself; the app's page when the payload has no review URL.
		link("Google Play", cmp.Or(r.URL, p.Links.Play))
		link("Status page", p.Links.StatusPage)
	case p.Alert != nil:
		a := p.Alert
		m.Title = alertTitle(a) + ": " + appLabel
		m.Text = a.Summary
		if a.Value != "" {
			v := "Value: " + a.Value
			if a.Previous != "" {
				v += " (before: " + a.Previous + ")"
			}
			m.Facts = append(m.Facts, v)
		}
		if !a.StartedAt.IsZero() {
			m.Facts = append(m.Facts, "Started: "+a.StartedAt.UTC().Format(time.RFC3339))
		}
		if a.EndedAt != nil {
			m.Facts = append(m.Facts, "Ended: "+a.EndedAt.UTC().Format(time.RFC3339))
		}
		link("Status page", p.Links.StatusPage)
		link("Google Play", p.Links.Play)
	default:
		m.Title = p.Event + ": " + appLabel
		link("Status page", p.Links.StatusPage)
		link("Google Play", p.Links.Play)
	}
	return m
}

// sentimentLabel is a stored label (NEGATIVE) as a person reads it (negative).
func sentimentLabel(s string) string { return strings.ToLower(s) }

func alertTitle(a *payloadAlert) string {
	switch a.Kind {
	case "rating_drop":
		return "Rating drop"
	case "negative_spike":
		return "Negative review spike"
	case "crawl_failing":
		if a.EndedAt != nil {
			return "Crawl recovered"
		}
		return "Crawl failing"
	case "new_version":
		return "New version"
	}
	return a.Kind
}

func digestNoun(event string, n int) string {
	nouns := map[string][2]string{
		"review":         {"review", "reviews"},
		"rating_drop":    {"rating drop", "rating drops"},
		"negative_spike": {"negative review spike", "negative review spikes"},
		"crawl_failing":  {"crawl failure alert", "crawl failure alerts"},
		"new_version":    {"new version", "new versions"},
	}
	w, ok := nouns[event]
	if !ok {
		return event + " messages"
	}
	if n == 1 {
		return w[0]
	}
	return w[1]
}

func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n += utf16.RuneLen(r)
	}
	return n
}

// renderText turns user text into the channel's form: each paragraph
// bidi-marked, then escaped, joined by "\n", cut with "…" so that the
// result is at most limit UTF-16 units (limit <= 0: nothing).
func renderText(s string, limit int, esc func(string) string) string {
	if limit <= 0 || s == "" {
		return ""
	}
	paras := strings.Split(strings.ReplaceAll(strings.TrimSpace(s), "\r\n", "\n"), "\n")
	var out strings.Builder
	used := 0
	for i, p := range paras {
		sep := ""
		if i > 0 {
			sep = "\n"
		}
		whole := sep + esc(bidiParagraph(p))
		if used+utf16Len(whole) <= limit {
			out.WriteString(whole)
			used += utf16Len(whole)
			continue
		}
		// This paragraph overflows: keep as much of it as fits with its
		// marks and the ellipsis.
		open, closing := "", ""
		if firstStrongRTL(p) {
			open, closing = rlm+rli, pdi
		}
		budget := limit - used - utf16Len(sep+open+closing+"…")
		var cut strings.Builder
		for _, r := range p {
			e := esc(string(r))
			if utf16Len(e) > budget {
				break
			}
			budget -= utf16Len(e)
			cut.WriteString(e)
		}
		if budget >= 0 {
			out.WriteString(sep + open + cut.String() + "…" + closing)
		}
		break
	}
	return out.String()
}

// renderLines escapes and joins lines the message builder made (their bidi
// marks are placed already).
func renderLines(lines []string, esc func(string) string) string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = esc(l)
	}
	return strings.Join(out, "\n")
}

// escapeMarkup escapes &, < and >: Slack's mrkdwn needs it (they delimit
// links and mentions; the review text and reply go in plain_text blocks,
// which Slack shows as written, so "*" or "<!channel>" in a review is just
// text), and so does Telegram's HTML parse mode, which knows only &lt; &gt;
// &amp; &quot;.
func escapeMarkup(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

func plainText(s string) string { return s }

type slackText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type slackBlock struct {
	Type     string      `json:"type"`
	Text     *slackText  `json:"text,omitempty"`
	Elements []slackText `json:"elements,omitempty"`
}

type slackBody struct {
	Text   string       `json:"text"`
	Blocks []slackBlock `json:"blocks"`
}

func renderSlack(m notifyMessage) slackBody {
	head := "*" + escapeMarkup(m.Title) + "*"
	if len(m.Facts) > 0 {
		head += "\n" + renderLines(m.Facts, escapeMarkup)
	}
	b := slackBody{Text: renderText(m.Title, slackBlockLimit, escapeMarkup)}
	b.Blocks = append(b.Blocks, slackBlock{Type: "section", Text: &slackText{"mrkdwn", renderText(head, slackBlockLimit, plainText)}})
	if m.Text != "" {
		b.Blocks = append(b.Blocks, slackBlock{Type: "section", Text: &slackText{"plain_text", renderText(m.Text, slackBlockLimit, plainText)}})
	}
	if m.Reply != "" {
		b.Blocks = append(b.Blocks, slackBlock{Type: "section", Text: &slackText{"plain_text", renderText("Developer reply:\n"+m.Reply, slackBlockLimit, plainText)}})
	}
	if len(m.Links) > 0 {
		var links []string
		for _, l := range m.Links {
			links = append(links, "<"+escapeMarkup(l.URL)+"|"+escapeMarkup(l.Label)+">")
		}
		b.Blocks = append(b.Blocks, slackBlock{Type: "context", Elements: []slackText{{"mrkdwn", strings.Join(links, " · ")}}})
	}
	return b
}

// Discord: content is markdown; every markdown character of user text is
// backslash-escaped (a heading, list or quote mark only at a line's start,
// where it means one), and allowed_mentions is empty so "@everyone" in a
// review pings nobody.
var discordEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `_`, `\_`, "~", `\~`, "`", "\\`", `|`, `\|`, `[`, `\[`, `]`, `\]`)

func discordEscape(s string) string {
	lines := strings.Split(discordEscaper.Replace(s), "\n")
	for i, l := range lines {
		body := strings.TrimLeft(l, rlm+rli+fsi+" ")
		if strings.HasPrefix(body, "#") || strings.HasPrefix(body, "-") || strings.HasPrefix(body, ">") {
			lines[i] = l[:len(l)-len(body)] + `\` + body
		}
	}
	return strings.Join(lines, "\n")
}

type discordEmbed struct {
	Title       string `json:"title"`
	URL         string `json:"url,omitempty"`
	Description string `json:"description,omitempty"`
	Color       int    `json:"color"`
}

type discordBody struct {
	Content         string         `json:"content"`
	Embeds          []discordEmbed `json:"embeds"`
	AllowedMentions struct {
		Parse []string `json:"parse"`
	} `json:"allowed_mentions"`
}

func renderDiscord(m notifyMessage, p notifyPayload) discordBody {
	head := "**" + discordEscape(m.Title) + "**"
	if len(m.Facts) > 0 {
		head += "\n" + renderLines(m.Facts, discordEscape)
	}
	head = renderText(head, discordContentLimit, plainText)
	left := discordContentLimit - utf16Len(head)
	text, reply := renderTextAndReply(m, left, "\n\n*Developer reply:*\n", min(500, left-25), discordEscape)
	content := head + text + reply
	b := discordBody{Content: content, Embeds: []discordEmbed{}}
	b.AllowedMentions.Parse = []string{}
	if len(m.Links) > 0 {
		var links []string
		for _, l := range m.Links {
			links = append(links, "["+l.Label+"]("+l.URL+")")
		}
		b.Embeds = append(b.Embeds, discordEmbed{
			Title: m.Links[0].Label, URL: m.Links[0].URL,
			Description: strings.Join(links, " · "), Color: messageColor(p),
		})
	}
	return b
}

// messageColor: red for bad news, green for good, amber between.
func messageColor(p notifyPayload) int {
	switch {
	case p.Review != nil && p.Review.Stars <= 2:
		return 0xE01E5A
	case p.Review != nil && p.Review.Stars >= 4:
		return 0x2EB67D
	case p.Alert != nil && p.Alert.EndedAt != nil:
		return 0x2EB67D
	case p.Alert != nil:
		return 0xE01E5A
	}
	return 0xECB22E
}

// renderTelegram is the whole message, at most 4096 UTF-16 units of
// markup (the visible text Telegram counts is shorter still).
func renderTelegram(m notifyMessage) string {
	var links []string
	for _, l := range m.Links {
		links = append(links, `<a href="`+html.EscapeString(l.URL)+`">`+escapeMarkup(l.Label)+`</a>`)
	}
	head := "<b>" + escapeMarkup(m.Title) + "</b>"
	if len(m.Facts) > 0 {
		head += "\n" + renderLines(m.Facts, escapeMarkup)
	}
	tail := ""
	if len(links) > 0 {
		tail = "\n\n" + strings.Join(links, " · ")
	}
	left := telegramTextLimit - utf16Len(head) - utf16Len(tail)
	text, reply := renderTextAndReply(m, left, "\n\n<i>Developer reply:</i>\n", min(1000, left-40), escapeMarkup)
	return head + text + reply + tail
}

// renderTextAndReply renders m's reply (after replyHead, at most replyLimit
// UTF-16 units) and then its text in what of left remains: the reply is
// short and kept whole, the text is cut.
func renderTextAndReply(m notifyMessage, left int, replyHead string, replyLimit int, esc func(string) string) (text, reply string) {
	if m.Reply != "" {
		reply = replyHead + renderText(m.Reply, replyLimit, esc)
		left -= utf16Len(reply)
	}
	if m.Text != "" {
		text = "\n\n" + renderText(m.Text, left-2, esc)
	}
	return text, reply
}

// renderEmail is the subject, the text/plain body and the HTML body (each
// paragraph dir="auto", so a mail client lays Persian right to left).
func renderEmail(m notifyMessage) (subject, text, htmlBody string) {
	subject = oneLine(m.Title)
	var t, h strings.Builder
	t.WriteString(m.Title + "\n")
	h.WriteString(`<!DOCTYPE html><html><body><div dir="auto">`)
	h.WriteString(`<h3 dir="auto">` + html.EscapeString(m.Title) + "</h3>")
	for _, f := range m.Facts {
		t.WriteString(f + "\n")
		h.WriteString(`<p dir="auto" style="margin:0">` + html.EscapeString(f) + "</p>")
	}
	para := func(label, s string) {
		if s == "" {
			return
		}
		t.WriteString("\n")
		if label != "" {
			t.WriteString(label + "\n")
			h.WriteString("<p><i>" + html.EscapeString(label) + "</i></p>")
		}
		body := renderText(s, 1<<30, plainText)
		t.WriteString(body + "\n")
		for _, l := range strings.Split(body, "\n") {
			h.WriteString(`<p dir="auto">` + html.EscapeString(l) + "</p>")
		}
	}
	para("", m.Text)
	para("Developer reply:", m.Reply)
	if len(m.Links) > 0 {
		t.WriteString("\n")
		h.WriteString("<p>")
		for i, l := range m.Links {
			t.WriteString(l.Label + ": " + l.URL + "\n")
			if i > 0 {
				h.WriteString(" · ")
			}
			h.WriteString(`<a href="` + html.EscapeString(l.URL) + `">` + html.EscapeString(l.Label) + "</a>")
		}
		h.WriteString("</p>")
	}
	h.WriteString("</div></body></html>")
	return subject, t.String(), h.String()
}
