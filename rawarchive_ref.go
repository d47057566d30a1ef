package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Unchanged pages (docs/design.md "Raw page archive"): compressing a 1.2 MB
// listing is most of what the archive costs the crawl, and most pages read
// again are what they were a cycle before. So the archive hashes a page's
// data blocks, the part the parser reads, and when an earlier page of the
// same app, kind and storefront had the same ones, it archives a reference
// record naming that page's offset instead of the page; reparse reads the
// page it names.

// rawEncodingRef is the content_encoding of a reference record: an empty
// value, and headers ref_partition and ref_offset naming the full record
// on raw-pages whose data blocks the answer had.
const rawEncodingRef = "reference"

const (
	headerRefPartition = "ref_partition"
	headerRefOffset    = "ref_offset"
)

// rawFullEvery bounds how far back a reference may point: a page whose
// full copy is older is archived in full again. raw-pages is trimmed
// oldest first, so only the references of its oldest hour can lose the page
// they name; at CRAWL_INTERVAL=5m one cycle in twelve is archived in full.
const rawFullEvery = time.Hour

// rawCopiesPerSlot is how many full pages the archive remembers per app,
// kind and storefront: an app's reviews pages share one slot.
const rawCopiesPerSlot = 16

// rawSlot is an app's pages of one kind in one storefront.
type rawSlot struct{ kind, pkg, lang, country string }

// rawCopy is a page archived in full, as the broker confirmed it.
type rawCopy struct {
	sum       uint64 // pageDataSum of the page
	partition int32
	offset    int64
	fetched   time.Time
}

// rawCopies remembers the full pages the archive's broker confirmed; a new
// process starts empty, so the first page of every app after a start is
// archived in full.
type rawCopies struct {
	seed  maphash.Seed
	mu    sync.Mutex
	slots map[rawSlot][]rawCopy // oldest first
}

func newRawCopies() *rawCopies {
	return &rawCopies{seed: maphash.MakeSeed(), slots: map[rawSlot][]rawCopy{}}
}

func slotOf(p rawPage) rawSlot { return rawSlot{p.Kind, p.Package, p.Lang, p.Country} }

// find is the full copy of p's slot with p's sum, not older than
// rawFullEvery.
func (c *rawCopies) find(p rawPage, sum uint64) (rawCopy, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cp := range c.slots[slotOf(p)] {
		if cp.sum == sum && p.FetchedAt.Sub(cp.fetched) < rawFullEvery {
			return cp, true
		}
	}
	return rawCopy{}, false
}

// add remembers a full copy the broker confirmed.
func (c *rawCopies) add(p rawPage, cp rawCopy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := slotOf(p)
	// A copy no page may refer to any more is forgotten.
	copies := slices.DeleteFunc(c.slots[s], func(o rawCopy) bool { return o.sum == cp.sum || cp.fetched.Sub(o.fetched) >= rawFullEvery })
	if len(copies) >= rawCopiesPerSlot {
		copies = copies[1:]
	}
	c.slots[s] = append(copies, cp)
}

// pageDataSum hashes what the parser reads of a page: a listing's routing
// table (AF_dataServiceRequests) and AF_initDataCallback blocks, a reviews
// answer's frames up to the per-answer counters at their end
// (["di",…],["af.httprm",…]). A page without them is hashed whole. The sum
// covers the lengths too.
func (c *rawCopies) pageDataSum(kind string, body []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	switch {
	case kind == pageDetails && bytes.Contains(body, []byte(">AF_initDataCallback(")):
		if start := bytes.Index(body, []byte("AF_dataServiceRequests")); start >= 0 {
			table := body[start:]
			if end := bytes.Index(table, []byte("AF_initDataChunkQueue")); end >= 0 {
				table = table[:end]
			}
			h.Write(table)
			h.WriteString(strconv.Itoa(len(table)))
		}
		for key, data := range dataBlocks(body) {
			h.WriteString(key)
			h.WriteByte(0)
			h.Write(data)
			h.WriteString(strconv.Itoa(len(data)))
		}
	case kind == pageReviews:
		if i := bytes.LastIndex(body, []byte(`["di",`)); i > 0 {
			body = body[:i]
		}
		h.Write(body)
		h.WriteString(strconv.Itoa(len(body)))
	default:
		h.Write(body)
		h.WriteString(strconv.Itoa(len(body)))
	}
	return h.Sum64()
}

// errRawRefGone: the full record a reference names is no longer on
// raw-pages (trimmed), or is not the page of the reference's app and kind.
var errRawRefGone = errors.New("the page it refers to is no longer archived")

// rawOffset is a record's place on raw-pages.
type rawOffset struct {
	partition int32
	offset    int64
}

// refOf is where a reference record points.
func refOf(r *kgo.Record) (rawOffset, error) {
	p, err1 := strconv.ParseInt(recordHeader(r, headerRefPartition), 10, 32)
	o, err2 := strconv.ParseInt(recordHeader(r, headerRefOffset), 10, 64)
	if err1 != nil || err2 != nil || p < 0 || o < 0 {
		return rawOffset{}, fmt.Errorf("%w: bad %s or %s header", errRawEncoding, headerRefPartition, headerRefOffset)
	}
	return rawOffset{int32(p), o}, nil
}

// maxRefCacheBytes bounds the compressed full pages a reparse keeps for
// the references that follow them (about 300 apps' pages).
const maxRefCacheBytes = 128 << 20

// rawRefResolver finds the full record a reference names: among the full
// records the reparse read (kept up to maxRefCacheBytes), else on the
// broker through fetch.
type rawRefResolver struct {
	fetch func(ctx context.Context, at rawOffset) (*kgo.Record, error) // nil: only what was read
	mu    sync.Mutex
	seen  map[rawOffset]*kgo.Record
	bytes int
}

func newRawRefResolver(fetch func(context.Context, rawOffset) (*kgo.Record, error)) *rawRefResolver {
	return &rawRefResolver{fetch: fetch, seen: map[rawOffset]*kgo.Record{}}
}

// keep remembers a full record the reparse read, copied: a record's value
// shares its batch's buffer.
func (rr *rawRefResolver) keep(r *kgo.Record) {
	if rr == nil || len(r.Value) > maxRefCacheBytes {
		return
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	at := rawOffset{r.Partition, r.Offset}
	if _, ok := rr.seen[at]; ok {
		return
	}
	for k, old := range rr.seen { // any: the order of the range is no guide
		if rr.bytes+len(r.Value) <= maxRefCacheBytes {
			break
		}
		rr.bytes -= len(old.Value)
		delete(rr.seen, k)
	}
	rr.seen[at] = &kgo.Record{Key: slices.Clone(r.Key), Value: slices.Clone(r.Value), Partition: r.Partition, Offset: r.Offset,
		Headers: []kgo.RecordHeader{
			{Key: headerKind, Value: []byte(recordHeader(r, headerKind))},
			{Key: headerEncoding, Value: []byte(recordHeader(r, headerEncoding))},
		}}
	rr.bytes += len(r.Value)
}

// resolve is the full record ref names, checked to be a full page of the
// same app and kind. A nil resolver knows no record.
func (rr *rawRefResolver) resolve(ctx context.Context, ref *kgo.Record) (*kgo.Record, error) {
	at, err := refOf(ref)
	if err != nil {
		return nil, err
	}
	if rr == nil {
		return nil, errRawRefGone
	}
	rr.mu.Lock()
	full, ok := rr.seen[at]
	rr.mu.Unlock()
	if !ok {
		if rr.fetch == nil {
			return nil, errRawRefGone
		}
		if full, err = rr.fetch(ctx, at); err != nil {
			return nil, err
		}
		rr.keep(full)
	}
	if !bytes.Equal(full.Key, ref.Key) || recordHeader(full, headerKind) != recordHeader(ref, headerKind) ||
		recordHeader(full, headerEncoding) != rawEncoding {
		return nil, errRawRefGone
	}
	return full, nil
}

// rawRecordFetcher reads one record of raw-pages by its offset, on a client
// of its own with opts (the broker's address and security): a reference
// whose page lies before the reparse's range.
func rawRecordFetcher(opts []kgo.Opt) func(context.Context, rawOffset) (*kgo.Record, error) {
	return func(ctx context.Context, at rawOffset) (*kgo.Record, error) {
		cl, err := kgo.NewClient(append(slices.Clip(opts), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
			topicRawPages: {at.partition: kgo.NewOffset().At(at.offset)}}))...)
		if err != nil {
			return nil, fmt.Errorf("kafka reader of %s: %w", topicRawPages, err)
		}
		defer cl.Close()
		// A trimmed offset makes the client start at the log's start, past
		// it; an empty partition answers nothing.
		for range 3 {
			pctx, cancel := context.WithTimeout(ctx, reparseIdlePoll)
			fs := cl.PollFetches(pctx)
			cancel()
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			var ferr error
			fs.EachError(func(t string, p int32, err error) {
				if !errors.Is(err, context.DeadlineExceeded) {
					ferr = errors.Join(ferr, fmt.Errorf("read %s/%d: %w", t, p, err))
				}
			})
			if ferr != nil {
				return nil, ferr
			}
			for r := range fs.RecordsAll() {
				if r.Offset == at.offset {
					return r, nil
				}
				return nil, fmt.Errorf("%w (%s/%d@%d)", errRawRefGone, topicRawPages, at.partition, at.offset)
			}
		}
		return nil, fmt.Errorf("%w (%s/%d@%d)", errRawRefGone, topicRawPages, at.partition, at.offset)
	}
}
