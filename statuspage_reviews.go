package main

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The reviews page, /reviews on the status page: a GET form with the
// reviews API's filters (no script), a page of results with the
// developer's reply under its review, keyset pagination, and a link to the
// same filters as CSV. It reads through the reviews API's pager.

//go:embed web/reviews.html.tmpl
var reviewsTemplateText string

var reviewsTemplates = template.Must(template.Must(statusTemplates.Clone()).Parse(reviewsTemplateText))

// reviewsCSP is the status page's, with the page's own form allowed.
var reviewsCSP = strings.Replace(statusCSP, "form-action 'none'", "form-action 'self'", 1)

// reviewsSource is what the status page needs to serve /reviews.
type reviewsSource struct {
	pager reviewPager
	token string // reviewsToken: empty means open
}

// listParams are the page's parameters that a form sends once per checked
// box; the page joins them into the API's comma-separated lists.
var listParams = []string{"package", "country", "lang", "stars", "sentiment", "text_lang", "topic"}

func (p *statusPage) registerReviews(mux *http.ServeMux) {
	if p.reviews == nil {
		return
	}
	mux.HandleFunc("GET /reviews", p.limitRenders(p.serveReviews))
	mux.HandleFunc("/reviews", methodNotAllowed("GET"))
}

type reviewsView struct {
	Title, Generated string
	Error            string
	Apps             []appChoice
	Form             reviewsForm
	Reviews          []reviewItem
	Next, First, CSV string
	Searched         bool
}

type appChoice struct {
	Package, Name string
	Selected      bool
}

// reviewsForm is what the form shows as filled in.
type reviewsForm struct {
	Q, Topic, Version, Since, Until, Sort, HasReply, TextLang, Limit string
	Country, Lang                                                    string // storefront codes, comma-separated
	Stars, Sentiments                                                []checkBox
}

type checkBox struct {
	Value, Label string
	On           bool
}

type reviewItem struct {
	Package, Stars, StarsLabel, User, When, Version, Sentiment, SentimentClass, Text, Reply, RepliedAt, URL string
	Storefronts                                                                                             string // us/en, ir/fa
	Topics                                                                                                  []string
	ThumbsUp                                                                                                string
}

func (p *statusPage) serveReviews(w http.ResponseWriter, r *http.Request) {
	if !tokenGiven(r, p.reviews.token, basicToken|bearerToken) {
		w.Header().Set("WWW-Authenticate", basicChallenge)
		http.Error(w, "the reviews page needs HTTP basic auth with the token (STATUS_PAGE_TOKEN, else REGISTRY_TOKEN) as the password", http.StatusUnauthorized)
		return
	}
	now := p.now()
	raw, _ := url.ParseQuery(r.URL.RawQuery) // a malformed pair is dropped, as a form never sends one
	vals := url.Values{}
	for k, vs := range raw {
		var keep []string
		for _, v := range vs {
			if v = strings.TrimSpace(v); v != "" {
				keep = append(keep, v)
			}
		}
		switch {
		case len(keep) == 0:
		case slices.Contains(listParams, k):
			vals.Set(k, strings.Join(keep, ","))
		default:
			vals[k] = keep
		}
	}
	view := reviewsView{Title: "Reviews · playwatch status", Generated: now.UTC().Format("2 Jan 2006 15:04:05 UTC"),
		Form: formOf(vals)}
	var apps []appChoice
	err := p.db.read(r.Context(), func(tx pgx.Tx) error {
		rows, err := tx.Query(r.Context(), `SELECT package_name, coalesce(nullif(display_name, ''), package_name)
			FROM apps_registry_application WHERE is_active ORDER BY 2, 1`)
		if err != nil {
			return err
		}
		var a appChoice
		_, err = pgx.ForEachRow(rows, []any{&a.Package, &a.Name}, func() error { apps = append(apps, a); return nil })
		return err
	})
	if err != nil {
		p.fail(w, r, err)
		return
	}
	q, qerr := parseReviewQuery(vals, now, nil)
	for _, a := range apps {
		a.Selected = slices.Contains(q.Packages, a.Package)
		view.Apps = append(view.Apps, a)
	}
	code := http.StatusOK
	if qerr != nil {
		view.Error = qerr.Error()
		code = http.StatusBadRequest
	} else {
		page, err := p.reviews.pager.page(r.Context(), q)
		if err != nil {
			p.fail(w, r, err)
			return
		}
		view.Searched = true
		for _, rv := range page.Reviews {
			view.Reviews = append(view.Reviews, reviewItemOf(rv))
		}
		base := q.reviewFilter.values()
		if q.Limit != defaultReviewLimit {
			base.Set("limit", strconv.Itoa(q.Limit))
		}
		if page.Next != nil {
			next := cloneValues(base)
			next.Set("cursor", page.Next.encode())
			view.Next = "/reviews?" + next.Encode()
		}
		if q.Cursor != nil {
			view.First = "/reviews?" + base.Encode()
		}
		csvq := q.reviewFilter.values()
		csvq.Set("format", "csv")
		csvq.Set("bom", "1")
		view.CSV = "/api/v1/reviews?" + csvq.Encode()
	}
	var buf bytes.Buffer
	if err := reviewsTemplates.ExecuteTemplate(&buf, "reviews", view); err != nil {
		p.fail(w, r, fmt.Errorf("status page: render reviews: %w", err))
		return
	}
	writeHTML(w, reviewsCSP, code, buf.Bytes())
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = slices.Clone(vs)
	}
	return out
}

// formOf is the form filled in as the request asked, also when the query
// was refused, so that the person can correct it.
func formOf(vals url.Values) reviewsForm {
	f := reviewsForm{Q: vals.Get("q"), Topic: vals.Get("topic"), Version: vals.Get("version"), Since: vals.Get("since"),
		Until: vals.Get("until"), Sort: vals.Get("sort"), HasReply: vals.Get("has_reply"), TextLang: vals.Get("text_lang"),
		Limit: vals.Get("limit"), Country: vals.Get("country"), Lang: vals.Get("lang")}
	stars := strings.Split(vals.Get("stars"), ",")
	for n := 1; n <= 5; n++ {
		s := strconv.Itoa(n)
		f.Stars = append(f.Stars, checkBox{s, s + " ★", slices.Contains(stars, s)})
	}
	sents := strings.Split(strings.ToUpper(vals.Get("sentiment")), ",")
	for _, s := range []string{"NEGATIVE", "NEUTRAL", "POSITIVE"} {
		f.Sentiments = append(f.Sentiments, checkBox{s, strings.ToLower(s), slices.Contains(sents, s)})
	}
	return f
}

func reviewItemOf(r reviewOut) reviewItem {
	v := reviewItem{Package: r.PackageName, User: optString(r.UserName), When: r.At.UTC().Format("2 Jan 2006 15:04"),
		Version: optString(r.AppVersion), Text: optText(r.Text), Reply: optText(r.ReplyText), URL: r.URL, Topics: r.Topics,
		ThumbsUp: groupDigits(r.ThumbsUp), Storefronts: strings.ReplaceAll(storefrontsCSV(r.Storefronts), ";", ", "), Stars: "no stars", StarsLabel: "no stars", Sentiment: "not scored", SentimentClass: "none"}
	if r.Stars != nil {
		n := int(*r.Stars)
		v.Stars = strings.Repeat("★", n) + strings.Repeat("☆", 5-n)
		v.StarsLabel = strconv.Itoa(n) + " of 5 stars"
	}
	if r.Sentiment != nil {
		v.Sentiment = strings.ToLower(*r.Sentiment)
		v.SentimentClass = map[string]string{"POSITIVE": "pos", "NEUTRAL": "neu", "NEGATIVE": "neg"}[*r.Sentiment]
	}
	if r.RepliedAt != nil {
		v.RepliedAt = r.RepliedAt.UTC().Format("2 Jan 2006 15:04")
	}
	return v
}

// appReviewLinks are the app page's links to its reviews.
type appReviewLinks struct {
	All, Negative, Version string
}

func appReviewLinksOf(pkg string, version *string) appReviewLinks {
	base := "/reviews?package=" + url.QueryEscape(pkg)
	l := appReviewLinks{All: base, Negative: base + "&sentiment=NEGATIVE"}
	if version != nil && *version != "" && len(*version) <= maxVersion {
		l.Version = base + "&version=" + url.QueryEscape(*version)
	}
	return l
}
