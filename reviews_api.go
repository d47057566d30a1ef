package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// reviewsAPI serves GET /api/v1/reviews (JSON pages and the CSV and NDJSON
// exports) and GET /api/v1/apps/{package_name}/stats. Reviews carry user
// names, so beyond loopback they need a token (reviewsToken).
type reviewsAPI struct {
	reviews reviewPager
	stats   querier        // app_stats and the registry, on the read pool
	locales localeDefaults // an app's storefront: the stats' country and lang
	token   string         // empty: open
	exports chan struct{}  // a slot per export running: maxExports
	now     func() time.Time
	logger  *slog.Logger
}

const (
	// maxExports is how many exports run at once; past it the answer is
	// 503 with Retry-After.
	maxExports = 2
	// exportPageSize is the reviews an export reads per statement unless
	// limit says otherwise.
	exportPageSize = 1000
	// exportPageDeadline is how long writing one page of an export may
	// take: the write deadline moves by it per page, so the server's
	// WriteTimeout does not cut a long export.
	exportPageDeadline = time.Minute
	exportRetryAfter   = 10
)

func newReviewsAPI(reads querier, locales localeDefaults, token string, logger *slog.Logger) *reviewsAPI {
	return &reviewsAPI{reviews: reviewsDB{pool: reads, locales: locales}, stats: reads, locales: locales, token: token,
		exports: make(chan struct{}, maxExports), now: time.Now, logger: logger}
}

// reviewsToken is the token the reviews API and page need: on a loopback
// PLAYWATCH_HTTP_ADDR that of the status page (none when it is empty), on
// any other STATUS_PAGE_TOKEN, else REGISTRY_TOKEN (which config requires
// there).
func reviewsToken(cfg Config) string {
	if isLoopback(cfg.HTTPAddr) || cfg.StatusPageToken != "" {
		return cfg.StatusPageToken
	}
	return cfg.RegistryToken
}

// register adds the routes; it may be called on a nil *reviewsAPI (the
// OpenAPI test lists the routes).
func (a *reviewsAPI) register(mux routeMux) {
	mux.HandleFunc("GET /api/v1/reviews", a.requireAccess(a.serveReviews))
	mux.HandleFunc("/api/v1/reviews", methodNotAllowed("GET"))
	mux.HandleFunc("GET /api/v1/apps/{package_name}/stats", a.requireAccess(a.serveStats))
	mux.HandleFunc("/api/v1/apps/{package_name}/stats", methodNotAllowed("GET"))
}

func (a *reviewsAPI) requireAccess(next http.HandlerFunc) http.HandlerFunc {
	// The page's realm: a browser signed in there downloads the CSV.
	return requireTokenGiven(func() string { return a.token }, basicToken|bearerToken, basicChallenge, func(w http.ResponseWriter) {
		writeError(w, http.StatusUnauthorized, "reviews need the token (STATUS_PAGE_TOKEN, else REGISTRY_TOKEN) as HTTP basic auth password or Authorization: Bearer")
	}, next)
}

type reviewsResponse struct {
	Reviews    []reviewOut `json:"reviews"`
	NextCursor *string     `json:"next_cursor"`
}

func (a *reviewsAPI) serveReviews(w http.ResponseWriter, r *http.Request) {
	vals, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, "malformed query string: "+err.Error())
		return
	}
	q, err := parseReviewQuery(vals, a.now(), []string{"json", "csv", "ndjson"})
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if q.Format != "json" {
		if !vals.Has("limit") {
			q.Limit = exportPageSize
		}
		a.exportReviews(w, r, q)
		return
	}
	page, err := a.reviews.page(r.Context(), q)
	if err != nil {
		a.readFailed(w, r, err)
		return
	}
	resp := reviewsResponse{Reviews: page.Reviews}
	if resp.Reviews == nil {
		resp.Reviews = []reviewOut{}
	}
	if page.Next != nil {
		c := page.Next.encode()
		resp.NextCursor = &c
	}
	writeJSON(w, http.StatusOK, resp)
}

// readFailed answers a read that failed before the answer began.
func (a *reviewsAPI) readFailed(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(r.Context().Err(), context.Canceled) {
		return
	}
	writeRequestFailed(w, r, a.logger, "reviews", err)
}

// exportFailure is what the last line of a failed export says.
func exportFailure(err error) string {
	if isStatementTimeout(err) {
		return "the export stopped: the database took longer than READ_STATEMENT_TIMEOUT to answer; what came before is complete, start again to get the rest"
	}
	return "the export stopped: reading the database failed; what came before is complete, the server log says why"
}

// takeExport takes an export slot, or answers 503.
func (a *reviewsAPI) takeExport(w http.ResponseWriter) bool {
	select {
	case a.exports <- struct{}{}:
		return true
	default:
		w.Header().Set("Retry-After", strconv.Itoa(exportRetryAfter))
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%d exports are running, the most at once; try again later", maxExports))
		return false
	}
}

func (a *reviewsAPI) exportReviews(w http.ResponseWriter, r *http.Request, q reviewQuery) {
	if !a.takeExport(w) {
		return
	}
	defer func() { <-a.exports }()
	rc := http.NewResponseController(w)
	// The first page is read before the answer begins: a database that
	// cannot answer is a 503, not a file that says so.
	first, err := a.reviews.page(r.Context(), q)
	if err != nil {
		a.readFailed(w, r, err)
		return
	}
	w.Header().Set("Content-Type", exportContentType(q.Format))
	w.Header().Set("Content-Disposition", `attachment; filename="reviews.`+q.Format+`"`)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_ = rc.SetWriteDeadline(time.Now().Add(exportPageDeadline))
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := newReviewEncoder(q.Format, bw, q.BOM)
	_, err = streamReviews(r.Context(), &prefetched{first: &first, next: a.reviews}, q, enc, func(int64) error {
		if err := bw.Flush(); err != nil {
			return err
		}
		_ = rc.Flush()
		return rc.SetWriteDeadline(time.Now().Add(exportPageDeadline))
	})
	if err != nil && r.Context().Err() == nil {
		a.logger.Warn("reviews export failed midway", "err", err)
		enc.fail(exportFailure(err))
	}
	_ = bw.Flush()
}

// prefetched is a pager whose first page was read already.
type prefetched struct {
	first *reviewPage
	next  reviewPager
}

func (p *prefetched) page(ctx context.Context, q reviewQuery) (reviewPage, error) {
	if f := p.first; f != nil {
		p.first = nil
		return *f, nil
	}
	return p.next.page(ctx, q)
}

func exportContentType(format string) string {
	switch format {
	case "csv":
		return "text/csv; charset=utf-8; header=present"
	case "ndjson":
		return "application/x-ndjson"
	}
	return "application/json"
}

// reviewEncoder writes the reviews of an export; fail ends it with a line
// saying it stopped.
type reviewEncoder interface {
	begin() error
	review(r *reviewOut) error
	end() error
	fail(msg string)
}

func newReviewEncoder(format string, w io.Writer, bom bool) reviewEncoder {
	switch format {
	case "csv":
		return &csvReviews{w: w, cw: csv.NewWriter(w), bom: bom}
	case "ndjson":
		return &ndjsonReviews{w: w, enc: json.NewEncoder(w)}
	}
	return &jsonReviews{w: w}
}

// streamReviews walks every page of q from its cursor and writes each
// review; afterPage runs after each page with the count so far.
func streamReviews(ctx context.Context, pager reviewPager, q reviewQuery, enc reviewEncoder, afterPage func(int64) error) (int64, error) {
	if err := enc.begin(); err != nil {
		return 0, err
	}
	var n int64
	for {
		page, err := pager.page(ctx, q)
		if err != nil {
			return n, err
		}
		for i := range page.Reviews {
			if err := enc.review(&page.Reviews[i]); err != nil {
				return n, err
			}
		}
		n += int64(len(page.Reviews))
		if page.Next == nil {
			return n, enc.end()
		}
		if err := afterPage(n); err != nil {
			return n, err
		}
		q.Cursor = page.Next
	}
}

type csvReviews struct {
	w   io.Writer
	cw  *csv.Writer
	bom bool
	rec []string
}

func (c *csvReviews) begin() error {
	if c.bom {
		if _, err := io.WriteString(c.w, "\uFEFF"); err != nil {
			return err
		}
	}
	return c.cw.Write(reviewCSVFields)
}

func optText(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func optTime(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func (c *csvReviews) review(r *reviewOut) error {
	stars := ""
	if r.Stars != nil {
		stars = strconv.Itoa(int(*r.Stars))
	}
	c.rec = append(c.rec[:0], r.PackageName, r.ReviewID, optText(r.UserName), stars, optText(r.Text), optTime(&r.At),
		strconv.FormatInt(r.ThumbsUp, 10), optText(r.AppVersion), optText(r.TextLang), optText(r.Sentiment),
		strings.Join(r.Topics, ";"), optText(r.ReplyText), optTime(r.RepliedAt), r.URL, storefrontsCSV(r.Storefronts))
	return c.cw.Write(c.rec)
}

// storefrontsCSV is a review's storefronts as a CSV cell: us/en;ir/fa.
func storefrontsCSV(locs []locale) string {
	parts := make([]string, len(locs))
	for i, l := range locs {
		parts[i] = l.Country + "/" + l.Lang
	}
	return strings.Join(parts, ";")
}

func (c *csvReviews) end() error {
	c.cw.Flush()
	return c.cw.Error()
}

func (c *csvReviews) fail(msg string) {
	c.cw.Flush()
	_, _ = io.WriteString(c.w, "# error: "+strings.ReplaceAll(msg, "\n", " ")+"\r\n")
}

type ndjsonReviews struct {
	w   io.Writer
	enc *json.Encoder
}

func (n *ndjsonReviews) begin() error              { return nil }
func (n *ndjsonReviews) review(r *reviewOut) error { return n.enc.Encode(r) }
func (n *ndjsonReviews) end() error                { return nil }
func (n *ndjsonReviews) fail(msg string)           { _ = n.enc.Encode(errorResponse{Error: msg}) }

// jsonReviews is `playwatch export reviews --format json`: the API's
// answer, with every review in it.
type jsonReviews struct {
	w     io.Writer
	wrote bool
}

func (j *jsonReviews) begin() error {
	_, err := io.WriteString(j.w, `{"reviews": [`)
	return err
}

func (j *jsonReviews) review(r *reviewOut) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	sep := "\n"
	if j.wrote {
		sep = ",\n"
	}
	j.wrote = true
	_, err = io.WriteString(j.w, sep+string(b))
	return err
}

func (j *jsonReviews) end() error {
	_, err := io.WriteString(j.w, "\n], \"next_cursor\": null}\n")
	return err
}

func (j *jsonReviews) fail(msg string) {
	b, _ := json.Marshal(msg)
	_, _ = io.WriteString(j.w, "\n], \"error\": "+string(b)+"}\n")
}

// The listing history: GET /api/v1/apps/{package_name}/stats.

// statsOut is one listing of an app as its stats export shows it.
type statsOut struct {
	CrawledAt    time.Time `json:"crawled_at"`
	Country      string    `json:"country"`
	Lang         string    `json:"lang"`
	Score        *float64  `json:"score"`
	Ratings      *int64    `json:"ratings"`
	Installs     *int64    `json:"installs"`
	RealInstalls *int64    `json:"real_installs"`
	ReviewsCount *int64    `json:"reviews_count"`
	Version      *string   `json:"version"`
	Ratings1     *int64    `json:"ratings_1"`
	Ratings2     *int64    `json:"ratings_2"`
	Ratings3     *int64    `json:"ratings_3"`
	Ratings4     *int64    `json:"ratings_4"`
	Ratings5     *int64    `json:"ratings_5"`
}

var statsFields = []string{"crawled_at", "country", "lang", "score", "ratings", "installs", "real_installs", "reviews_count",
	"version", "ratings_1", "ratings_2", "ratings_3", "ratings_4", "ratings_5"}

// statsQuery is one stats export.
type statsQuery struct {
	Package      string
	Countries    []string // only these storefronts' listings (none: every storefront's)
	Langs        []string
	Since, Until time.Time
	Format       string
	BOM          bool
}

func parseStatsQuery(pkg string, vals url.Values, now time.Time) (statsQuery, error) {
	q := statsQuery{Package: pkg, Format: "json"}
	for key, vs := range vals {
		if len(vs) > 1 {
			return q, badParam(key, "given %d times", len(vs))
		}
		v := vs[0]
		switch key {
		case "since", "until":
			t, err := parseReviewTime(v, now)
			if err != nil {
				return q, badParam(key, "%v", err)
			}
			if key == "since" {
				q.Since = t
			} else {
				q.Until = t
			}
		case "format":
			if v != "json" && v != "csv" {
				return q, badParam("format", "%q is not json or csv", v)
			}
			q.Format = v
		case "bom":
			if v != "0" && v != "1" {
				return q, badParam("bom", "must be 0 or 1, not %q", v)
			}
			q.BOM = v == "1"
		case "country", "lang":
			check := map[string]func(string, string) error{"country": validateCountryFilter, "lang": validateLang}[key]
			var list []string
			for _, c := range strings.Split(v, ",") {
				if err := check(key, c); err != nil {
					return q, badParam(key, "%q: %v", c, err)
				}
				list = append(list, c)
			}
			if key == "country" {
				q.Countries = list
			} else {
				q.Langs = list
			}
		default:
			return q, badParam(key, "unknown query parameter (known: country, lang, since, until, format, bom)")
		}
	}
	q.BOM = q.BOM && q.Format == "csv"
	return q, nil
}

// statsPageSize is the listings read per statement.
const statsPageSize = 2000

var errStatsAppNotFound = errors.New("app not registered")

// streamStats reads the app's listings from q.Since to q.Until, oldest
// first (the storefronts of one crawl time by country and lang), a page per
// statement, and hands each to emit.
func streamStats(ctx context.Context, db querier, q statsQuery, emit func(*statsOut) error, afterPage func() error) error {
	var id int64
	rows, err := db.Query(ctx, `SELECT id FROM apps_registry_application WHERE package_name = $1`, q.Package)
	if err != nil {
		return fmt.Errorf("stats: app: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { return nil }); err != nil {
		return fmt.Errorf("stats: app: %w", err)
	}
	if id == 0 {
		return errStatsAppNotFound
	}
	// Keyset paging on (crawled_at, country, lang): two storefronts may be
	// crawled at the same time. "" sorts before every code: from after on.
	after, afterCountry, afterLang := time.Time{}, "", ""
	if !q.Since.IsZero() {
		after = q.Since
	}
	until := q.Until
	if until.IsZero() {
		until = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	for {
		rows, err := db.Query(ctx, `SELECT crawled_at, country, lang, score, ratings, min_installs, real_installs, reviews_count, version,
			ratings_1, ratings_2, ratings_3, ratings_4, ratings_5 FROM app_stats
			WHERE application_id = $1 AND crawled_at >= $2 AND (crawled_at, country::text, lang::text) > ($2, $5::text, $6::text) AND crawled_at < $3
			  AND ($7::text[] IS NULL OR country = ANY($7)) AND ($8::text[] IS NULL OR lang = ANY($8))
			ORDER BY crawled_at, country, lang LIMIT $4`,
			id, after, until, statsPageSize, afterCountry, afterLang, q.Countries, q.Langs)
		if err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		var s statsOut
		n := 0
		_, err = pgx.ForEachRow(rows, []any{&s.CrawledAt, &s.Country, &s.Lang, &s.Score, &s.Ratings, &s.Installs, &s.RealInstalls, &s.ReviewsCount,
			&s.Version, &s.Ratings1, &s.Ratings2, &s.Ratings3, &s.Ratings4, &s.Ratings5}, func() error {
			out := s
			out.CrawledAt = out.CrawledAt.UTC()
			after, afterCountry, afterLang = s.CrawledAt, s.Country, s.Lang
			n++
			s = statsOut{}
			return emit(&out)
		})
		if err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		if n < statsPageSize {
			return nil
		}
		if err := afterPage(); err != nil {
			return err
		}
	}
}

// statsCSVRecord is one listing as a CSV record.
func statsCSVRecord(s *statsOut) []string {
	i := func(n *int64) string {
		if n == nil {
			return ""
		}
		return strconv.FormatInt(*n, 10)
	}
	score := ""
	if s.Score != nil {
		score = strconv.FormatFloat(*s.Score, 'f', -1, 64)
	}
	return []string{s.CrawledAt.Format(time.RFC3339Nano), s.Country, s.Lang, score, i(s.Ratings), i(s.Installs), i(s.RealInstalls),
		i(s.ReviewsCount), optText(s.Version), i(s.Ratings1), i(s.Ratings2), i(s.Ratings3), i(s.Ratings4), i(s.Ratings5)}
}

func (a *reviewsAPI) serveStats(w http.ResponseWriter, r *http.Request) {
	pkg, ok := pathPackage(w, r)
	if !ok {
		return
	}
	vals, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, "malformed query string: "+err.Error())
		return
	}
	q, err := parseStatsQuery(pkg, vals, a.now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if q.Format == "json" {
		// A listing history is small (a row per crawl): one answer.
		out := struct {
			Stats []*statsOut `json:"stats"`
		}{Stats: []*statsOut{}}
		err := streamStats(r.Context(), a.stats, q, func(s *statsOut) error {
			out.Stats = append(out.Stats, s)
			return nil
		}, func() error { return nil })
		if !answeredError(w, r, err, errStatsAppNotFound, pkg+" is not registered", a.readFailed) {
			writeJSON(w, http.StatusOK, out)
		}
		return
	}
	if !a.takeExport(w) {
		return
	}
	defer func() { <-a.exports }()
	// The app is looked up before the answer begins, so that an unknown
	// one is a 404 and not an empty file.
	var exists bool
	rows, err := a.stats.Query(r.Context(), `SELECT EXISTS (SELECT 1 FROM apps_registry_application WHERE package_name = $1)`, pkg)
	if err == nil {
		exists, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	}
	if err != nil {
		a.readFailed(w, r, err)
		return
	}
	if !exists {
		writeError(w, http.StatusNotFound, pkg+" is not registered")
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", exportContentType("csv"))
	w.Header().Set("Content-Disposition", `attachment; filename="`+pkg+`-stats.csv"`)
	w.Header().Set("Cache-Control", "no-store")
	_ = rc.SetWriteDeadline(time.Now().Add(exportPageDeadline))
	bw := bufio.NewWriterSize(w, 64<<10)
	if q.BOM {
		_, _ = bw.WriteString("\uFEFF")
	}
	cw := csv.NewWriter(bw)
	_ = cw.Write(statsFields)
	err = streamStats(r.Context(), a.stats, q, func(s *statsOut) error { return cw.Write(statsCSVRecord(s)) }, func() error {
		cw.Flush()
		if err := bw.Flush(); err != nil {
			return err
		}
		_ = rc.Flush()
		return rc.SetWriteDeadline(time.Now().Add(exportPageDeadline))
	})
	cw.Flush()
	if err != nil && r.Context().Err() == nil {
		a.logger.Warn("stats export failed midway", "package", pkg, "err", err)
		_, _ = bw.WriteString("# error: " + exportFailure(err) + "\r\n")
	}
	_ = bw.Flush()
}
