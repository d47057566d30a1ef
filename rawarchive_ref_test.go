package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// recordingPublisher keeps what a reparse publishes, as JSON by crawl time
// and kind, with crawled_at left out: the messages of two pages compare.
type recordingPublisher struct {
	mu   sync.Mutex
	msgs map[string][]string // kind + " " + crawled_at → messages
}

func (p *recordingPublisher) add(kind string, at time.Time, m any) {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := kind + " " + at.UTC().Format(time.RFC3339Nano)
	p.msgs[k] = append(p.msgs[k], string(b))
}

func (p *recordingPublisher) PublishAppStats(_ context.Context, m appStatsMessage) error {
	at := m.CrawledAt
	m.CrawledAt = time.Time{}
	p.add(pageDetails, at, m)
	return nil
}

func (p *recordingPublisher) PublishReviews(_ context.Context, _ string, ms []reviewMessage) error {
	for _, m := range ms {
		at := m.CrawledAt
		m.CrawledAt = time.Time{}
		p.add(pageReviews, at, m)
	}
	return nil
}

func (p *recordingPublisher) of(kind string, at time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.msgs[kind+" "+at.UTC().Format(time.RFC3339Nano)]
}

// A page whose data blocks are those of the app's last page of that kind
// and storefront is archived as a reference to it, even when what lies
// outside them changed (a nonce, an answer's counters); a page whose data
// changed, or of another storefront, is archived in full. A reference
// reparses to the messages of the page it names, with its own crawled_at,
// whether that page lies in the reparse's range or before it; one whose
// page was trimmed is reported as such.
func TestRawArchiveUnchangedPageIsAReference(t *testing.T) {
	t.Parallel()
	const pkg = "com.example.unchanged"
	_, brokers := newTestBroker(t, t.TempDir())
	createRawPagesTopic(t, brokers)
	reg := prometheus.NewRegistry()
	archive, flush := newTestArchive(t, brokers, reg)
	ctx := context.Background()
	details := readPlaystoreFixture(t, "details_com.mojang.minecraftpe_en_us.html")
	reviews := readPlaystoreFixture(t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	page := func(kind, lang string, body []byte, at time.Time) rawPage {
		return rawPage{Kind: kind, Package: pkg, Lang: lang, Country: "us", URL: "https://play.google.com/store/apps/details?id=" + pkg,
			Status: 200, FetchedAt: at, CrawledAt: at, Body: body}
	}
	replace := func(b []byte, old, new string) []byte {
		t.Helper()
		if !bytes.Contains(b, []byte(old)) {
			t.Fatalf("the fixture has no %q", old)
		}
		return bytes.Replace(b, []byte(old), []byte(new), 1)
	}

	crawl1 := time.Date(2026, 7, 1, 10, 0, 0, 0, time.UTC)
	archive.archive(ctx, page(pageDetails, "en", details, crawl1))
	archive.archive(ctx, page(pageReviews, "en", reviews, crawl1))
	flush()
	time.Sleep(20 * time.Millisecond) // the records' timestamps are milliseconds
	afterFirst := time.Now()
	time.Sleep(20 * time.Millisecond)
	crawl2 := crawl1.Add(5 * time.Minute)
	archive.archive(ctx, page(pageDetails, "en", append(slices.Clone(details), `<script nonce="c2">x()</script>`...), crawl2))
	archive.archive(ctx, page(pageReviews, "en", replace(reviews, `["di",228]`, `["di",311]`), crawl2))
	flush()
	crawl3 := crawl2.Add(5 * time.Minute)
	archive.archive(ctx, page(pageDetails, "en", details, crawl3))
	archive.archive(ctx, page(pageReviews, "en", replace(reviews, `\"niec\"`, `\"nice\"`), crawl3))
	archive.archive(ctx, page(pageDetails, "fa", details, crawl3))
	flush()

	recs := consumeAll(t, brokers, topicRawPages, 7)
	slices.SortFunc(recs, func(a, b *kgo.Record) int { return int(a.Offset - b.Offset) })
	wantEnc := []string{rawEncoding, rawEncoding, rawEncodingRef, rawEncodingRef, rawEncodingRef, rawEncoding, rawEncoding}
	wantRef := map[int]int{2: 0, 3: 1, 4: 0}
	for i, r := range recs {
		if got := recordHeader(r, headerEncoding); got != wantEnc[i] {
			t.Errorf("record %d (%s %s): %s %q, want %q", i, recordHeader(r, headerKind), recordHeader(r, headerCrawledAt), headerEncoding, got, wantEnc[i])
		}
		if to, ok := wantRef[i]; ok {
			if recordHeader(r, headerRefPartition) != strconv.Itoa(int(recs[to].Partition)) || recordHeader(r, headerRefOffset) != strconv.FormatInt(recs[to].Offset, 10) ||
				len(r.Value) != 0 {
				t.Errorf("reference %d: %s=%s %s=%s, %d value bytes; want record %d's partition %d and offset %d", i, headerRefPartition,
					recordHeader(r, headerRefPartition), headerRefOffset, recordHeader(r, headerRefOffset), len(r.Value), to, recs[to].Partition, recs[to].Offset)
			}
		}
	}
	for kind, want := range map[string]float64{pageDetails: 2, pageReviews: 1} {
		if got := metricValue(t, reg, "playwatch_raw_pages_unchanged_total", map[string]string{"kind": kind}); got != want {
			t.Errorf("unchanged %s pages: %v, want %v", kind, got, want)
		}
	}
	if got := metricValue(t, reg, "playwatch_raw_pages_archived_total", map[string]string{"kind": pageDetails}); got != 4 {
		t.Errorf("details pages archived: %v, want 4", got)
	}

	// Every record's messages, the pages they name in the range.
	pub := &recordingPublisher{msgs: map[string][]string{}}
	if sum := reparseRange(t, brokers, &reparser{parser: storeParser{}, pub: pub}, afterFirst.Add(-time.Hour), nil); sum.Read != 7 || sum.Parsed != 7 ||
		sum.Stats != 4 || sum.Reviews != 3*150 {
		t.Fatalf("reparse: %s", sum)
	}
	same := func(what string, a, b []string) {
		t.Helper()
		if len(a) == 0 || !slices.Equal(a, b) {
			t.Errorf("%s: %d messages, %d messages or not the same", what, len(a), len(b))
		}
	}
	same("details of the unchanged crawls", pub.of(pageDetails, crawl1), pub.of(pageDetails, crawl2))
	same("details of crawl 3", pub.of(pageDetails, crawl1), pub.of(pageDetails, crawl3)[:1])
	same("reviews of crawl 2", pub.of(pageReviews, crawl1), pub.of(pageReviews, crawl2))
	if changed := pub.of(pageReviews, crawl3); len(changed) != 150 || slices.Equal(changed, pub.of(pageReviews, crawl1)) || !bytes.Contains([]byte(changed[0]), []byte(`"nice"`)) {
		t.Errorf("the changed reviews page reparsed to the old reviews: %.200s", changed)
	}

	// The references of crawl 2 and 3 name pages before this range: read
	// from the broker.
	pub2 := &recordingPublisher{msgs: map[string][]string{}}
	if sum := reparseRange(t, brokers, &reparser{parser: storeParser{}, pub: pub2}, afterFirst, nil); sum.Read != 5 || sum.Parsed != 5 {
		t.Fatalf("reparse after the first crawl: %s", sum)
	}
	same("details of crawl 2, its page before the range", pub.of(pageDetails, crawl2), pub2.of(pageDetails, crawl2))
	same("reviews of crawl 2, its page before the range", pub.of(pageReviews, crawl2), pub2.of(pageReviews, crawl2))

	// A new process remembers nothing: its first page is archived in full,
	// and so is a page whose full copy is older than rawFullEvery.
	restarted, flush2 := newTestArchive(t, brokers, prometheus.NewRegistry())
	crawl4 := crawl3.Add(5 * time.Minute)
	restarted.archive(ctx, page(pageDetails, "en", details, crawl4))
	flush2()
	restarted.archive(ctx, page(pageDetails, "en", details, crawl4.Add(time.Minute)))
	flush2()
	restarted.archive(ctx, page(pageDetails, "en", details, crawl4.Add(rawFullEvery)))
	flush2()
	// What the parser reads changed: the routing table, a data block.
	restarted.archive(ctx, page(pageDetails, "en", replace(details, "id:'Ws7gDc'", "id:'Xs7gDc'"), crawl4.Add(rawFullEvery+time.Minute)))
	restarted.archive(ctx, page(pageDetails, "en", replace(details, ", sideChannel:", ",1, sideChannel:"), crawl4.Add(rawFullEvery+2*time.Minute)))
	flush2()
	recs = consumeAll(t, brokers, topicRawPages, 12)
	slices.SortFunc(recs, func(a, b *kgo.Record) int { return int(a.Offset - b.Offset) })
	for i, want := range []string{rawEncoding, rawEncodingRef, rawEncoding, rawEncoding, rawEncoding} {
		if got := recordHeader(recs[7+i], headerEncoding); got != want {
			t.Errorf("after the restart, page %d: %s %q, want %q", i, headerEncoding, got, want)
		}
	}

	// The first crawl's pages trimmed: the references to them say so.
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
		var del kadm.Offsets
		del.Add(kadm.Offset{Topic: topicRawPages, Partition: recs[0].Partition, At: recs[1].Offset + 1})
		if resps, err := adm.DeleteRecords(ctx, del); err != nil || resps.Error() != nil {
			t.Fatalf("delete records: %v %v", err, resps.Error())
		}
	})
	sum := reparseRange(t, brokers, &reparser{parser: storeParser{}}, afterFirst.Add(-time.Hour), nil)
	if sum.Read != 10 || sum.Parsed != 6 || sum.Failing["details: the unchanged page it refers to was trimmed"] != 2 ||
		sum.Failing["reviews: the unchanged page it refers to was trimmed"] != 1 {
		t.Errorf("reparse after the trim: %s", sum)
	}
}
