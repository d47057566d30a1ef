package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// `playwatch reparse` reads the pages the crawl archived on raw-pages
// (rawarchive.go), runs today's parser on each and publishes the messages the
// crawl would have published, each with the crawled_at of its page's
// header: the crawl's own. So what the crawl stored already is not stored
// twice (app_stats is unique per app and crawled_at, a review's version only
// moves to a newer crawled_at), and what failed to parse then is stored now.

const reparseSynopsis = "reparse [--since 24h|RFC3339] [--until 1h|RFC3339] [--package P] [--dry-run] [flags]"

// reparseFlags are the command's own flags.
type reparseFlags struct {
	since, until, pkg string
	dryRun            bool
}

func (f *reparseFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.since, "since", "24h", "pages archived within this duration (24h, 7d) or after this time (RFC 3339)")
	fs.StringVar(&f.until, "until", "", "pages archived before this time (RFC 3339) or this long ago; default: up to the newest")
	fs.StringVar(&f.pkg, "package", "", "only the pages of this package")
	fs.BoolVar(&f.dryRun, "dry-run", false, "parse and count, but publish nothing")
}

// reparseWindow is the archive time range to read; a zero Until: to the end.
type reparseWindow struct {
	Since, Until time.Time
}

func (f *reparseFlags) window(now time.Time) (reparseWindow, error) {
	var w reparseWindow
	var err error
	if w.Since, err = timeFlag("--since", f.since, now); err != nil {
		return w, err
	}
	if f.until != "" {
		if w.Until, err = timeFlag("--until", f.until, now); err != nil {
			return w, err
		}
		if !w.Until.After(w.Since) {
			return w, usageError{fmt.Sprintf("--until %s is not after --since %s", w.Until.Format(time.RFC3339), w.Since.Format(time.RFC3339))}
		}
	}
	if f.pkg != "" {
		if err := validatePackageName(f.pkg); err != nil {
			return w, usageError{"--package: " + err.Error()}
		}
	}
	return w, nil
}

// rawRange is, per partition of raw-pages, the offsets to read: from the
// first at or after Since up to (not including) the first at or after Until.
type rawRange map[int32][2]int64

func (r rawRange) pages() int64 {
	var n int64
	for _, o := range r {
		n += o[1] - o[0]
	}
	return n
}

// offsets are where a consumer of r starts, for kgo.ConsumePartitions.
func (r rawRange) offsets() map[string]map[int32]kgo.Offset {
	ps := map[int32]kgo.Offset{}
	for p, o := range r {
		if o[1] > o[0] {
			ps[p] = kgo.NewOffset().At(o[0])
		}
	}
	return map[string]map[int32]kgo.Offset{topicRawPages: ps}
}

// planRawRange looks up the offsets of w on raw-pages by the records'
// timestamps (the time the crawl produced them).
func planRawRange(ctx context.Context, adm *kadm.Client, w reparseWindow) (rawRange, error) {
	starts, err := adm.ListOffsetsAfterMilli(ctx, w.Since.UnixMilli(), topicRawPages)
	if err != nil {
		return nil, fmt.Errorf("list the offsets of %s: %w", topicRawPages, err)
	}
	var ends kadm.ListedOffsets
	if w.Until.IsZero() {
		ends, err = adm.ListEndOffsets(ctx, topicRawPages)
	} else {
		ends, err = adm.ListOffsetsAfterMilli(ctx, w.Until.UnixMilli(), topicRawPages)
	}
	if err != nil {
		return nil, fmt.Errorf("list the offsets of %s: %w", topicRawPages, err)
	}
	r := rawRange{}
	if err := eachOffsetPair(starts, ends, func(s, e kadm.ListedOffset) {
		r[s.Partition] = [2]int64{s.Offset, max(e.Offset, s.Offset)}
	}); err != nil {
		return nil, fmt.Errorf("%w (is RAW_ARCHIVE on? without it nothing is archived)", err)
	}
	return r, nil
}

// recordPoller is the part of *kgo.Client that reads the range.
type recordPoller interface {
	PollFetches(ctx context.Context) kgo.Fetches
}

// reparser parses archived pages again and publishes their messages; pub
// nil is a dry run.
type reparser struct {
	parser pageParser
	pub    crawlPublisher
	pkg    string // only this package's pages; "": all
	// logStarts reads the first offset each partition still holds.
	logStarts func(context.Context) (map[int32]int64, error)
	// progress gets a line every progressEvery while the run lasts.
	progress io.Writer
	// fetch reads a full page a reference record names from before the
	// range (rawRecordFetcher); nil: only pages of the range resolve.
	fetch func(context.Context, rawOffset) (*kgo.Record, error)
	refs  *rawRefResolver // set by run
}

// reparseSummary is what a run did.
type reparseSummary struct {
	Read, Parsed    int
	Failing         map[string]int // "kind: reason" → pages
	Stats, Reviews  int            // messages published (or, in a dry run, that would be)
	DryRun          bool
	Took            time.Duration
	UnexpectedPages int   // records that are no 200 answer of a known kind
	Trimmed         int64 // pages of the range deleted before they were read
}

func (s reparseSummary) String() string {
	failing := "none"
	if len(s.Failing) > 0 {
		var fs []string
		for _, k := range slices.Sorted(maps.Keys(s.Failing)) {
			fs = append(fs, fmt.Sprintf("%d %s", s.Failing[k], k))
		}
		failing = strings.Join(fs, ", ")
	}
	verb := "published"
	if s.DryRun {
		verb = "not published (dry run)"
	}
	out := fmt.Sprintf("pages read: %d, parsed: %d, still failing: %s; messages %s: %d app-stats, %d reviews; took %s",
		s.Read, s.Parsed, failing, verb, s.Stats, s.Reviews, s.Took.Round(time.Millisecond))
	if s.Trimmed > 0 {
		out += fmt.Sprintf("; %d pages of the range were trimmed from %s before they were read", s.Trimmed, topicRawPages)
	}
	if s.UnexpectedPages > 0 {
		out += fmt.Sprintf("; %d records skipped: not a 200 answer of a known kind", s.UnexpectedPages)
	}
	return out
}

// reparseWorkers parse and publish pages at once: a send waits for the
// broker's confirmation, one after the other a cycle's 1,600 pages would take
// half a minute. One app's pages go to one worker, in their order.
const reparseWorkers = 8

// run reads rng through poller, which starts at rng's first offsets.
func (rp *reparser) run(ctx context.Context, poller recordPoller, rng rawRange) (reparseSummary, error) {
	start := time.Now()
	dec, err := newRawPageDecoder(reparseWorkers)
	if err != nil {
		return reparseSummary{}, err
	}
	defer dec.close()
	rp.refs = newRawRefResolver(rp.fetch)
	sum := reparseSummary{Failing: map[string]int{}, DryRun: rp.pub == nil}
	left := map[int32]int64{} // partition → its end offset, while records are due
	for p, o := range rng {
		if o[1] > o[0] {
			left[p] = o[1]
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var mu sync.Mutex // guards sum
	var wg sync.WaitGroup
	queues := make([]chan *kgo.Record, reparseWorkers)
	for i := range queues {
		queues[i] = make(chan *kgo.Record, 16)
		wg.Go(func() {
			for r := range queues[i] {
				if ctx.Err() != nil {
					continue
				}
				res, err := rp.page(ctx, dec, r)
				if err != nil {
					res.stats, res.reviews = 0, 0 // not published
				}
				mu.Lock()
				sum.add(res)
				mu.Unlock()
				if err != nil {
					cancel(err)
				}
			}
		})
	}
	got := rangeRead{read: map[int32]int64{}, past: map[int32]int64{}}
	err = rp.feed(ctx, poller, left, queues, &got, func(seen int64) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(rp.progress, "reparse: %d of %d archived pages read, %d parsed, %d failing\n", seen, rng.pages(), sum.Parsed, sum.Read-sum.Parsed)
	})
	for _, q := range queues {
		close(q)
	}
	wg.Wait()
	sum.Took = time.Since(start)
	sum.Trimmed = got.trimmed(rng)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return sum, cause
	}
	return sum, err
}

// reparseIdlePoll is how long a poll that brings nothing waits before the
// reparse asks whether the rest of the range was trimmed meanwhile: raw-pages
// is trimmed freely, and a consumer whose position was deleted starts again
// at the log's new start, which may lie past the range.
const reparseIdlePoll = 2 * time.Second

// rangeRead is how far the reading of a range got, by partition.
type rangeRead struct {
	read map[int32]int64 // records of the range read
	past map[int32]int64 // the offset the reading got to: past its last record, or the range's end once done
}

// trimmed are the pages of rng that the reading got past without reading
// them: deleted before they were read. What an error or a Ctrl-C left
// unread is not counted.
func (g rangeRead) trimmed(rng rawRange) int64 {
	var n int64
	for p, past := range g.past {
		n += max(past-rng[p][0]-g.read[p], 0)
	}
	return n
}

// feed hands the records of the range to the workers' queues, by key,
// recording in got how far it read, and reports progress every
// progressEvery.
func (rp *reparser) feed(ctx context.Context, poller recordPoller, left map[int32]int64, queues []chan *kgo.Record, got *rangeRead, progress func(seen int64)) error {
	seen := int64(0)
	next := time.Now().Add(progressEvery)
	for len(left) > 0 {
		pctx, cancel := context.WithTimeout(ctx, reparseIdlePoll)
		fs := poller.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		if fs.NumRecords() == 0 && pctx.Err() != nil {
			starts, err := rp.logStarts(ctx)
			if err != nil {
				return err
			}
			for p, end := range left {
				if starts[p] >= end {
					delete(left, p) // the rest of it is gone
					got.past[p] = end
				}
			}
			continue
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = errors.Join(ferr, fmt.Errorf("read %s/%d: %w", t, p, err))
			}
		})
		if ferr != nil {
			return ferr
		}
		for r := range fs.RecordsAll() {
			end, due := left[r.Partition]
			if !due {
				continue
			}
			if r.Offset >= end-1 {
				delete(left, r.Partition)
			}
			if r.Offset >= end {
				got.past[r.Partition] = end
				continue
			}
			seen++
			got.read[r.Partition]++
			got.past[r.Partition] = r.Offset + 1
			h := fnv.New32a()
			h.Write(r.Key)
			select {
			case queues[h.Sum32()%uint32(len(queues))] <- r:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if now := time.Now(); now.After(next) && rp.progress != nil {
			next = now.Add(progressEvery)
			progress(seen)
		}
	}
	return nil
}

// rawLogStarts reads the first offset each partition of raw-pages still
// holds.
func rawLogStarts(adm *kadm.Client) func(context.Context) (map[int32]int64, error) {
	return func(ctx context.Context) (map[int32]int64, error) {
		starts, err := listTopicOffsets(ctx, adm.ListStartOffsets, topicRawPages)
		if err != nil {
			return nil, fmt.Errorf("list the start offsets of %s: %w", topicRawPages, err)
		}
		return offsetsByPartition(starts), nil
	}
}

// pageResult is what reparsing one record gave.
type pageResult struct {
	read, parsed, stats, reviews int
	failing                      string // "kind: reason" of a page that still fails
	unexpected                   bool
}

func (s *reparseSummary) add(r pageResult) {
	s.Read += r.read
	s.Parsed += r.parsed
	s.Stats += r.stats
	s.Reviews += r.reviews
	if r.failing != "" {
		s.Failing[r.failing]++
	}
	if r.unexpected {
		s.UnexpectedPages++
	}
}

// page reparses one record; only a publish that fails is an error.
func (rp *reparser) page(ctx context.Context, d *rawPageDecoder, r *kgo.Record) (pageResult, error) {
	pkg := string(r.Key)
	if rp.pkg != "" && pkg != rp.pkg {
		return pageResult{}, nil
	}
	kind := recordHeader(r, headerKind)
	if (kind != pageDetails && kind != pageReviews) || recordHeader(r, headerStatus) != "200" {
		return pageResult{unexpected: true}, nil
	}
	fail := func(reason string) (pageResult, error) {
		return pageResult{read: 1, failing: kind + ": " + reason}, nil
	}
	failParse := func(err error) (pageResult, error) {
		// A parser bug: the summary counts it, this line says where.
		if perr := (*panicError)(nil); errors.As(err, &perr) && rp.progress != nil {
			fmt.Fprintf(rp.progress, "reparse: %s page of %s (%s/%d@%d): %v\n", kind, pkg, r.Topic, r.Partition, r.Offset, err)
		}
		return fail(reparseFailureReason(err))
	}
	crawledAt, err := time.Parse(time.RFC3339Nano, recordHeader(r, headerCrawledAt))
	if err != nil || validatePackageName(pkg) != nil {
		return fail("bad key or " + headerCrawledAt + " header")
	}
	crawledAt = messageTime(crawledAt)
	// The storefront the page was read in; a page without one is
	// published without it, as an older playwatch did.
	loc := locale{Lang: recordHeader(r, headerLang), Country: recordHeader(r, headerCountry)}
	var c checks
	if c.storefront(loc.Country, loc.Lang); c.result() != nil {
		return fail("bad " + headerLang + " or " + headerCountry + " header")
	}
	full := r
	if recordHeader(r, headerEncoding) == rawEncodingRef {
		// An unchanged page: the full page it names has its data blocks.
		switch full, err = rp.refs.resolve(ctx, r); {
		case errors.Is(err, errRawRefGone):
			return fail("the unchanged page it refers to was trimmed")
		case errors.Is(err, errRawEncoding):
			return fail("cannot decode")
		case err != nil:
			return fail("cannot read the page it refers to")
		}
	}
	body, err := d.decode(full)
	if err != nil {
		return fail("cannot decode")
	}
	if full == r {
		rp.refs.keep(r) // for the references that follow
	}
	res := pageResult{read: 1, parsed: 1}
	if kind == pageDetails {
		details, err := parseRecovering(rp.parser.details, body)
		if err != nil {
			return failParse(err)
		}
		details.PackageName = pkg
		m := appStatsFromDetails(details, loc)
		m.CrawledAt = crawledAt
		res.stats = 1
		if rp.pub != nil {
			return res, rp.pub.PublishAppStats(ctx, m)
		}
		return res, nil
	}
	page, err := parseRecovering(rp.parser.reviews, body)
	if err != nil {
		return failParse(err)
	}
	msgs := make([]reviewMessage, len(page.Reviews))
	for i, rv := range page.Reviews {
		msgs[i] = reviewMessageFrom(pkg, loc, rv)
		msgs[i].CrawledAt = crawledAt
	}
	res.reviews = len(msgs)
	if rp.pub != nil && len(msgs) > 0 {
		return res, rp.pub.PublishReviews(ctx, pkg, msgs)
	}
	return res, nil
}

// reparseFailureReason is the summary's reason of a page that still fails.
func reparseFailureReason(err error) string {
	var perr *parseError
	switch {
	case errors.As(err, &perr):
		return perr.reason()
	case errors.Is(err, errRPCEntry):
		return errRPCEntry.Error()
	default:
		return "unreadable"
	}
}
