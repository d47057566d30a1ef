package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// archiveTestPages archives n reviews pages of as many packages.
func archiveTestPages(t *testing.T, brokers []string, n int) {
	t.Helper()
	archive, flush := newTestArchive(t, brokers, prometheus.NewRegistry())
	body := readPlaystoreFixture(t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	for i := range n {
		archive.archive(context.Background(), rawPage{Kind: pageReviews, Package: fmt.Sprintf("com.example.part%d", i), Lang: "en", Country: "us",
			Status: 200, FetchedAt: time.Now(), Body: body})
	}
	flush()
}

// Only pages the reading got past unread count as trimmed: a run stopped
// (Ctrl-C, an error) before it read the range reports none, and one that
// meets a gap at a partition's start counts exactly the deleted pages.
func TestReparseCountsOnlyTrimmedPagesAsTrimmed(t *testing.T) {
	t.Parallel()
	_, brokers := newTestBroker(t, t.TempDir())
	createRawPagesTopic(t, brokers)
	archiveTestPages(t, brokers, 6)

	var rng rawRange
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
		var err error
		if rng, err = planRawRange(ctx, adm, reparseWindow{Since: time.Now().Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(rng.offsets()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Ctrl-C before the first page
	rp := &reparser{parser: storeParser{}, logStarts: func(context.Context) (map[int32]int64, error) { return nil, nil }}
	sum, err := rp.run(ctx, cl, rng)
	if err == nil || sum.Trimmed != 0 || strings.Contains(sum.String(), "trimmed") {
		t.Errorf("an interrupted reparse: %v, %s; want an error and no pages trimmed", err, sum)
	}

	deleted := 0
	sum = reparseRange(t, brokers, &reparser{parser: storeParser{}}, time.Now().Add(-time.Hour), func(rng rawRange) {
		var del kadm.Offsets
		for p, o := range rng {
			if o[1]-o[0] >= 2 {
				del.Add(kadm.Offset{Topic: topicRawPages, Partition: p, At: o[0] + 1})
				deleted++
			}
		}
		if deleted == 0 {
			t.Fatalf("no partition holds two pages of the range: %v", rng)
		}
		withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
			if resps, err := adm.DeleteRecords(ctx, del); err != nil || resps.Error() != nil {
				t.Fatalf("delete records: %v %v", err, resps.Error())
			}
		})
	})
	if sum.Trimmed != int64(deleted) || sum.Read != 6-deleted {
		t.Errorf("a reparse whose range lost %d first pages: %s", deleted, sum)
	}
}

// onceParser is today's parser, except that its first call panics.
type onceParser struct{ calls atomic.Int32 }

func (p *onceParser) details(b []byte) (appDetails, error) { return storeParser{}.details(b) }

func (p *onceParser) reviews(b []byte) (reviewsPage, error) {
	if p.calls.Add(1) == 1 {
		panic("parser bug")
	}
	return storeParser{}.reviews(b)
}

// A page whose parse panics is a page that still fails ("parser panicked");
// the reparse goes on with the others.
func TestReparseSurvivesAParserPanic(t *testing.T) {
	_, brokers := newTestBroker(t, t.TempDir())
	createRawPagesTopic(t, brokers)
	archiveTestPages(t, brokers, 6)
	var progress syncBuffer
	sum := reparseRange(t, brokers, &reparser{parser: &onceParser{}, progress: &progress}, time.Now().Add(-time.Hour), nil)
	if sum.Read != 6 || sum.Parsed != 5 || sum.Failing["reviews: parser panicked"] != 1 || len(sum.Failing) != 1 {
		t.Errorf("reparse with a parser that panics once: %s; want 6 read, 5 parsed, 1 failing: parser panicked", sum)
	}
	if !strings.Contains(progress.String(), "reparse: reviews page of com.example.part") || !strings.Contains(progress.String(), "reparse_test.go") ||
		!strings.Contains(progress.String(), "parser bug") {
		t.Errorf("stderr does not say which page and where the parser panicked:\n%s", progress.String())
	}
}

// A page whose lang or country header is no code fails (it would be stored
// in a storefront nobody reads); one without both headers is parsed, its
// messages without a storefront, as an older playwatch's.
func TestReparseChecksTheStorefrontHeaders(t *testing.T) {
	_, brokers := newTestBroker(t, t.TempDir())
	createRawPagesTopic(t, brokers)
	archive, flush := newTestArchive(t, brokers, prometheus.NewRegistry())
	body := readPlaystoreFixture(t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	for i, l := range []locale{{"en", "us"}, {"e n", "us"}, {"en", ""}, {"", ""}} {
		archive.archive(context.Background(), rawPage{Kind: pageReviews, Package: fmt.Sprintf("com.example.part%d", i), Lang: l.Lang, Country: l.Country,
			Status: 200, FetchedAt: time.Now(), Body: body})
	}
	flush()
	sum := reparseRange(t, brokers, &reparser{parser: storeParser{}}, time.Now().Add(-time.Hour), nil)
	if sum.Read != 4 || sum.Parsed != 2 || sum.Failing["reviews: bad lang or country header"] != 2 || len(sum.Failing) != 1 {
		t.Errorf("reparse of pages with good, bad and no storefront headers: %s; want 4 read, 2 parsed, 2 failing: bad lang or country header", sum)
	}
}
