package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"time"
)

// `playwatch export reviews|stats`: the reviews API's exports from the
// command line, on the database of the running appliance (as `dlq list`
// reads it), page by page, with progress on stderr.

const exportSynopsis = "export reviews|stats [--package P] [--country C] [--lang L] [--q Q] [--stars S] [--sentiment L] [--since D] [--until T] [--format csv|ndjson|json] [--output FILE] [flags]"

var exportUsage = usageOf(exportSynopsis)

var exportSubcommands = []string{"reviews", "stats"}

type exportFlags struct {
	pkg, country, lang, q, stars, sentiment, since, until, format, output string
	bom                                                                   bool
}

func (f *exportFlags) register(sub string) func(*flag.FlagSet) {
	return func(fs *flag.FlagSet) {
		fs.StringVar(&f.pkg, "package", "", "only this app (reviews: or a comma-separated list; stats: required)")
		fs.StringVar(&f.since, "since", "", "from this time (RFC 3339) or this long ago (7d)")
		fs.StringVar(&f.until, "until", "", "before this time (RFC 3339) or this long ago")
		fs.StringVar(&f.country, "country", "", "only the storefronts of this country, e.g. ir (or a comma-separated list)")
		fs.StringVar(&f.lang, "lang", "", "only the storefronts of this language, e.g. fa (or a comma-separated list)")
		fs.StringVar(&f.output, "output", "", "write to this file instead of stdout")
		fs.BoolVar(&f.bom, "bom", false, "start a CSV with a UTF-8 byte order mark (spreadsheet programs that need it to show Persian)")
		if sub == "reviews" {
			fs.StringVar(&f.q, "q", "", "text search, as the API's q")
			fs.StringVar(&f.stars, "stars", "", "only these stars, e.g. 1,2")
			fs.StringVar(&f.sentiment, "sentiment", "", "only these labels, e.g. NEGATIVE,NEUTRAL")
			fs.StringVar(&f.format, "format", "csv", "csv, ndjson or json")
		} else {
			fs.StringVar(&f.format, "format", "csv", "csv or json")
		}
	}
}

// values is the flags as the API's query parameters.
func (f *exportFlags) values(sub string) url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("since", f.since)
	set("until", f.until)
	set("format", f.format)
	set("country", f.country)
	set("lang", f.lang)
	if f.bom {
		v.Set("bom", "1")
	}
	if sub == "reviews" {
		set("package", f.pkg)
		set("q", f.q)
		set("stars", f.stars)
		set("sentiment", f.sentiment)
	}
	return v
}

// cmdExport is `playwatch export reviews|stats`.
func cmdExport(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return commandGroup{usage: exportUsage, subs: subcommandsOf(exportSubcommands, cmdExportSubcommand),
		missing: "export needs a subcommand: reviews or stats"}.run(ctx, args, getenv, stdout, stderr)
}

// cmdExportSubcommand is `export reviews` or `export stats`.
func cmdExportSubcommand(ctx context.Context, sub string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var f exportFlags
	cl, err := parseNoArgs("export "+sub, exportSynopsis, args, getenv, stdout, stderr, f.register(sub))
	if err != nil {
		return err
	}
	now := time.Now()
	var rq reviewQuery
	var sq statsQuery
	if sub == "reviews" {
		rq, err = parseReviewQuery(f.values(sub), now, []string{"csv", "ndjson", "json"})
		rq.Limit = exportPageSize
	} else {
		if f.pkg == "" {
			return usageError{"export stats needs --package"}
		}
		if err = validatePackageName(f.pkg); err == nil {
			sq, err = parseStatsQuery(f.pkg, f.values(sub), now)
		} else {
			err = badParam("package", "%v", err)
		}
	}
	if perr := (*paramError)(nil); errors.As(err, &perr) {
		return usageError{"--" + perr.param + ": " + perr.msg}
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) (err error) {
		out := stdout
		if f.output != "" {
			file, cerr := os.Create(f.output)
			if cerr != nil {
				return fmt.Errorf("--output: %w", cerr)
			}
			// The named err: a failed close (a full disk) fails the export.
			defer func() { err = errors.Join(err, file.Close()) }()
			out = file
		}
		bw := bufio.NewWriterSize(out, 64<<10)
		defer func() { err = errors.Join(err, bw.Flush()) }()
		if sub == "reviews" {
			return exportReviews(ctx, reviewsDB{pool: be.pool, locales: cl.cfg.Locales}, rq, bw, stderr)
		}
		return exportStats(ctx, be.pool, sq, bw, stderr)
	})
}

// exportReviews writes the reviews q picks in its format, with progress on
// stderr at each page.
func exportReviews(ctx context.Context, db reviewsDB, q reviewQuery, w *bufio.Writer, stderr io.Writer) error {
	started := time.Now()
	enc := newReviewEncoder(q.Format, w, q.BOM)
	n, err := streamReviews(ctx, db, q, enc, func(n int64) error {
		fmt.Fprintf(stderr, "exported %d reviews…\n", n)
		return w.Flush()
	})
	if err != nil {
		enc.fail(exportFailure(err))
		return fmt.Errorf("export reviews stopped after %d reviews: %w", n, err)
	}
	fmt.Fprintf(stderr, "exported %d reviews in %s\n", n, time.Since(started).Round(time.Millisecond))
	return nil
}

// exportStats writes the app's listing history as CSV or as the API's JSON.
func exportStats(ctx context.Context, db querier, q statsQuery, w *bufio.Writer, stderr io.Writer) error {
	var n int64
	var emit func(*statsOut) error
	var cw *csv.Writer
	if q.Format == "csv" {
		if q.BOM {
			_, _ = w.WriteString("\uFEFF")
		}
		cw = csv.NewWriter(w)
		if err := cw.Write(statsFields); err != nil {
			return err
		}
		emit = func(s *statsOut) error { n++; return cw.Write(statsCSVRecord(s)) }
	} else {
		_, _ = w.WriteString(`{"stats": [`)
		emit = func(s *statsOut) error {
			b, err := json.Marshal(s)
			if err != nil {
				return err
			}
			if n > 0 {
				_, _ = w.WriteString(",")
			}
			n++
			_, err = w.WriteString("\n" + string(b))
			return err
		}
	}
	err := streamStats(ctx, db, q, emit, func() error {
		fmt.Fprintf(stderr, "exported %d listings…\n", n)
		if cw != nil {
			cw.Flush()
		}
		return w.Flush()
	})
	if cw != nil {
		cw.Flush()
	}
	switch {
	case errors.Is(err, errStatsAppNotFound):
		return fmt.Errorf("%s is not registered", q.Package)
	case err != nil && cw != nil:
		_, _ = w.WriteString("# error: " + exportFailure(err) + "\r\n")
	case err != nil:
		b, _ := json.Marshal(exportFailure(err))
		_, _ = w.WriteString("\n], \"error\": " + string(b) + "}\n")
	case cw == nil:
		_, _ = w.WriteString("\n]}\n")
	}
	if err != nil {
		return fmt.Errorf("export stats stopped after %d listings: %w", n, err)
	}
	fmt.Fprintf(stderr, "exported %d listings\n", n)
	return nil
}
