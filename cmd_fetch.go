package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func cmdFetch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var lang, country string
	var n int
	var maxWait time.Duration
	cl, err := parseCommandLine("fetch", "fetch [--lang L --country C] [--reviews N] [--max-wait D] PACKAGE", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&lang, "lang", "", "language (hl); default PLAYSTORE_LANG")
		fs.StringVar(&country, "country", "", "storefront country (gl); default PLAYSTORE_COUNTRY")
		fs.IntVar(&n, "reviews", 0, "newest reviews to read; default REVIEWS_PER_APP")
		durationVar(fs, &maxWait, "max-wait", defaultFetchMaxWait, "give up rather than wait longer than this for a benched egress or a retry; 0: wait as long as it takes")
	})
	if err != nil {
		return err
	}
	if len(cl.args) != 1 {
		return usageError{fmt.Sprintf("fetch takes one package name, got %q", cl.args)}
	}
	pkg := cl.args[0]
	if err := validatePackageName(pkg); err != nil {
		return usageError{err.Error()}
	}
	loc := cl.cfg.Locales.Default
	for _, o := range []struct {
		name, v string
		dst     *string
	}{{"--lang", lang, &loc.Lang}, {"--country", country, &loc.Country}} {
		if o.v == "" {
			continue
		}
		if err := parseLocaleCode(o.v); err != nil {
			return usageError{fmt.Sprintf("%s %q: %v", o.name, o.v, err)}
		}
		*o.dst = o.v
	}
	if n == 0 {
		n = cl.cfg.ReviewsPerApp
	}
	if n < 0 {
		return usageError{"--reviews must be positive"}
	}
	if maxWait < 0 {
		return usageError{"--max-wait must not be negative"}
	}
	store, err := newPlayStore(cl.cfg, maxWait, nil, prometheus.NewRegistry(), cl.logger)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cl.cfg.CrawlAppTimeout)
	defer cancel()
	return fetchApp(ctx, store, pkg, loc, n, stdout)
}
