package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The raw page archive (docs/design.md "Raw page archive"): every 200 answer of the
// Play Store, compressed, on the raw-pages topic, so that `playwatch
// reparse` can parse the pages of a day again after a parser fix instead
// of crawling them again at the store's scarce rate.

const topicRawPages = "raw-pages"

// parserVersion goes into every archived page's header. Bump it when a
// change of playstore_parse.go reads a page differently (a field more, a
// layout it now understands), so that the pages read by the old parser can
// be told apart.
const parserVersion = "1"

// Kinds of archived pages (the request kind header), also the endpoint
// label of the Play Store metrics.
const (
	pageDetails = "details"
	pageReviews = "reviews"
)

// crawlPathOf is the crawl path a page kind feeds.
func crawlPathOf(kind string) string {
	if kind == pageDetails {
		return pathStats
	}
	return pathReviews
}

// Headers of a raw-pages record; times are RFC 3339 in UTC.
const (
	headerURL           = "url"
	headerKind          = "kind" // details or reviews
	headerLang          = "lang"
	headerCountry       = "country"
	headerStatus        = "status"
	headerFetchedAt     = "fetched_at" // when the answer arrived
	headerCrawledAt     = "crawled_at" // the crawl's time, every message of the crawl's crawled_at
	headerParserVersion = "parser_version"
	headerEncoding      = "content_encoding" // how the value is compressed: zstd
)

// rawEncoding is how the archive compresses: one zstd frame (RFC 8878) per
// value, at zstd's fastest level, which any zstd tool reads; at ~1.2 MB a
// details page, compression is most of what the archive costs the crawl
// (README, "Raw page archive").
const rawEncoding = "zstd"

// rawZstdWindow bounds the encoder's window, and so its memory, to a little
// over a details page: a longer one finds no more matches in a page.
const rawZstdWindow = 2 << 20

type crawlTimeKey struct{}

// withCrawlTime gives the Play Store client the time of the crawl its
// requests belong to, which the archive records with each page.
func withCrawlTime(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, crawlTimeKey{}, t)
}

// crawlTimeOf is the time withCrawlTime set, or zero.
func crawlTimeOf(ctx context.Context) time.Time {
	t, _ := ctx.Value(crawlTimeKey{}).(time.Time)
	return t
}

// rawPage is one answer as the client received it.
type rawPage struct {
	Kind, Package, Lang, Country, URL string
	Status                            int
	FetchedAt, CrawledAt              time.Time
	Body                              []byte // valid only during archive: its buffer is reused
}

// rawProducer is the part of *kgo.Client the archive uses: a produce that
// fails at once rather than wait when the client's buffer is full.
type rawProducer interface {
	TryProduce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
}

// rawArchive publishes pages to raw-pages without ever holding the crawl
// up: it compresses the body in the crawl's goroutine (the body's buffer
// goes back to the pool right after), hands the record to its own Kafka
// client and returns; the client's buffer is bounded (rawArchiveBuffer), and
// a page that does not fit is dropped and counted, as is one the broker
// does not take.
type rawArchive struct {
	producer rawProducer
	// encoder is one for all crawl workers: compressing is short next to
	// the wait for the store, and each encoder holds its window's memory.
	encoder *zstd.Encoder
	scratch sync.Pool // *[]byte, the encoder's output before it is copied
	// copies are the pages archived in full, which an unchanged page
	// refers to (rawarchive_ref.go).
	copies  *rawCopies
	metrics *rawArchiveMetrics
	logger  *slog.Logger
	// lastLog is when a failure was last logged (unix nanoseconds): one
	// line per rawFailureLogEvery, not one per page, while a broker is down.
	lastLog  atomic.Int64
	unlogged atomic.Int64
}

// rawArchiveBuffer bounds the bytes of compressed pages the archive's Kafka
// client holds; beyond it pages are dropped (about 100 details pages).
const rawArchiveBuffer = 32 << 20

// rawFailureLogEvery is how often archive failures are logged at most.
const rawFailureLogEvery = time.Minute

// rawProducerOptions are the options of the archive's own Kafka client on
// top of the producer settings: no batch compression (the values are
// compressed), a bounded buffer, and franz-go's default batch size, which
// lies below the 1,048,588-byte message.max.bytes of Apache Kafka's and
// kfake's defaults.
func rawProducerOptions(s producerSettings) []kgo.Opt {
	return append(producerOptions(s), kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.MaxBufferedBytes(rawArchiveBuffer))
}

func newRawArchive(p rawProducer, reg prometheus.Registerer, logger *slog.Logger) (*rawArchive, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
		zstd.WithWindowSize(rawZstdWindow))
	if err != nil {
		return nil, fmt.Errorf("raw archive compressor: %w", err)
	}
	return &rawArchive{producer: p, encoder: enc, copies: newRawCopies(), metrics: newRawArchiveMetrics(reg), logger: logger,
		scratch: sync.Pool{New: func() any { return new([]byte) }}}, nil
}

func (a *rawArchive) archive(ctx context.Context, p rawPage) {
	sum := a.copies.pageDataSum(p.Kind, p.Body)
	full, unchanged := a.copies.find(p, sum)
	var value []byte
	encoding := rawEncoding
	if unchanged {
		encoding = rawEncodingRef
	} else {
		value = a.compress(p.Body)
	}
	r := &kgo.Record{Topic: topicRawPages, Key: []byte(p.Package), Value: value, Headers: []kgo.RecordHeader{
		{Key: headerURL, Value: []byte(p.URL)},
		{Key: headerKind, Value: []byte(p.Kind)},
		{Key: headerLang, Value: []byte(p.Lang)},
		{Key: headerCountry, Value: []byte(p.Country)},
		{Key: headerStatus, Value: []byte(strconv.Itoa(p.Status))},
		{Key: headerFetchedAt, Value: []byte(p.FetchedAt.UTC().Format(time.RFC3339Nano))},
		{Key: headerCrawledAt, Value: []byte(crawledAtHeader(p))},
		{Key: headerParserVersion, Value: []byte(parserVersion)},
		{Key: headerEncoding, Value: []byte(encoding)},
	}}
	if unchanged {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headerRefPartition, Value: []byte(strconv.Itoa(int(full.partition)))},
			kgo.RecordHeader{Key: headerRefOffset, Value: []byte(strconv.FormatInt(full.offset, 10))})
	}
	// The promise must not keep p.Body: its buffer is reused.
	p.Body = nil
	// Not the crawl's ctx: franz-go fails a buffered record whose context
	// ends, and a crawl that ended need not lose its pages.
	a.producer.TryProduce(context.WithoutCancel(ctx), r, func(r *kgo.Record, err error) {
		if err != nil {
			a.failed(p, err)
			return
		}
		if unchanged {
			a.metrics.unchanged.WithLabelValues(p.Kind).Inc()
		} else {
			// Only a page the broker has can be referred to.
			a.copies.add(p, rawCopy{sum: sum, partition: r.Partition, offset: r.Offset, fetched: p.FetchedAt})
		}
		a.metrics.pages.WithLabelValues(p.Kind).Inc()
		a.metrics.bytes.WithLabelValues(p.Kind).Add(float64(len(r.Value)))
	})
}

// crawledAtHeader is the crawl's time, or the page's arrival when the
// request belongs to no crawl.
func crawledAtHeader(p rawPage) string {
	t := p.CrawledAt
	if t.IsZero() {
		t = p.FetchedAt
	}
	return messageTime(t).Format(time.RFC3339Nano)
}

// compress returns body compressed, in a slice of its own and of its size:
// EncodeAll into an empty slice would allocate the size of the body.
func (a *rawArchive) compress(body []byte) []byte {
	buf := a.scratch.Get().(*[]byte)
	*buf = a.encoder.EncodeAll(body, (*buf)[:0])
	out := slices.Clone(*buf)
	a.scratch.Put(buf)
	return out
}

func (a *rawArchive) failed(p rawPage, err error) {
	a.metrics.failures.Inc()
	now := time.Now().UnixNano()
	last := a.lastLog.Load()
	if now-last < int64(rawFailureLogEvery) || !a.lastLog.CompareAndSwap(last, now) {
		a.unlogged.Add(1)
		return
	}
	a.logger.Warn("cannot archive a Play Store page in "+topicRawPages+"; the crawl goes on without it",
		"package", p.Package, "kind", p.Kind, "err", err, "failures_not_logged", a.unlogged.Swap(0))
}

// maxRawPageBytes bounds what a raw page may decompress to: the client's
// MaxBody, so that a record of the topic cannot make reparse allocate more
// than a crawl would.
const maxRawPageBytes = 16 << 20

// errRawEncoding: a raw-pages record that cannot be decoded.
var errRawEncoding = errors.New("raw page cannot be decoded")

// rawPageDecoder decodes raw-pages values, up to its concurrency at once
// (a further decode waits), each into at most maxRawPageBytes.
type rawPageDecoder struct {
	zstd *zstd.Decoder
}

func newRawPageDecoder(concurrency int) (*rawPageDecoder, error) {
	// The bound applies to what a frame says it holds and to what it
	// turns out to hold, whichever is first.
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(concurrency), zstd.WithDecoderMaxMemory(maxRawPageBytes))
	if err != nil {
		return nil, fmt.Errorf("raw page decoder: %w", err)
	}
	return &rawPageDecoder{zstd: d}, nil
}

// decode returns the body of a raw-pages record, as its content_encoding
// header says it is compressed.
func (d *rawPageDecoder) decode(r *kgo.Record) ([]byte, error) {
	if enc := recordHeader(r, headerEncoding); enc != rawEncoding {
		return nil, fmt.Errorf("%w: %s %q, want %q", errRawEncoding, headerEncoding, enc, rawEncoding)
	}
	body, err := d.zstd.DecodeAll(r.Value, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errRawEncoding, err)
	}
	return body, nil
}

func (d *rawPageDecoder) close() { d.zstd.Close() }

// recordHeader is the value of r's header key, or "".
func recordHeader(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

type rawArchiveMetrics struct {
	pages     *prometheus.CounterVec
	unchanged *prometheus.CounterVec
	bytes     *prometheus.CounterVec
	failures  prometheus.Counter
}

func newRawArchiveMetrics(reg prometheus.Registerer) *rawArchiveMetrics {
	mk := metricMaker{reg}
	m := &rawArchiveMetrics{
		pages:     mk.counterVec("playwatch_raw_pages_archived_total", "Play Store answers the broker confirmed on "+topicRawPages+", by kind (details, reviews).", "kind"),
		unchanged: mk.counterVec("playwatch_raw_pages_unchanged_total", "Of the answers confirmed on "+topicRawPages+", those archived as a reference to an earlier answer with the same data blocks, by kind.", "kind"),
		bytes:     mk.counterVec("playwatch_raw_page_bytes_archived_total", "Compressed bytes of the answers confirmed on "+topicRawPages+", by kind.", "kind"),
		failures:  mk.counter("playwatch_raw_archive_failures_total", "Play Store answers not archived (buffer full, broker refused or unreachable); the crawl goes on without them."),
	}
	for _, k := range []string{pageDetails, pageReviews} {
		m.pages.WithLabelValues(k)
		m.unchanged.WithLabelValues(k)
		m.bytes.WithLabelValues(k)
	}
	return m
}
