package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
)

// The seed corpora live in testdata/fuzz/<FuzzName>/ (small slices of the
// fixtures); `go test -fuzz=FuzzName` explores from there.

// FuzzExtractDataBlock: any page gives an app or a parse error, never a panic.
func FuzzExtractDataBlock(f *testing.F) {
	f.Add([]byte(`<script>var AF_dataServiceRequests = {'ds:5' : {id:'Ws7gDc',request:[]}}; var AF_initDataChunkQueue = [];</script>` +
		`<script nonce="x">AF_initDataCallback({key: 'ds:5', hash: '1', data:[null,[null,null,[["Title"]]]], sideChannel: {}});</script>`))
	f.Fuzz(func(t *testing.T, page []byte) {
		d, err := parseDetailsPage(page)
		if err != nil {
			if _, ok := err.(*parseError); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		routed := routedBlocks(page, detailsRPC)
		if !slices.Contains(routed, d.Block) && !(len(routed) == 0 && d.Block == fallbackDetailsBlock) {
			t.Fatalf("app read from %s, routed blocks %v", d.Block, routed)
		}
		for key, data := range dataBlocks(page) {
			if !bytes.Contains(page, data) || key == "" {
				t.Fatalf("block %q is not part of the page", key)
			}
		}
	})
}

// FuzzBatchexecuteFrames: any answer gives a payload, nothing, or an error;
// reviews read from it always have an id.
func FuzzBatchexecuteFrames(f *testing.F) {
	f.Add([]byte(")]}'\n\n" + `[["wrb.fr","UsvDTd","[[[\"id\",[\"n\"],5,null,\"c\",[1,2],0]],[null,\"t\"]]",null,null,null,"generic"]]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		page, err := parseReviewsAnswer(body, "UsvDTd")
		if err != nil {
			return
		}
		for _, r := range page.Reviews {
			if r.ReviewID == "" || r.At.IsZero() {
				t.Fatalf("unusable review %+v", r)
			}
			if r.Score != nil && (*r.Score < 1 || *r.Score > 5) {
				t.Fatalf("score %d", *r.Score)
			}
		}
	})
}

// FuzzJSONFieldReader checks the lazy reader against encoding/json: on valid
// JSON every accessor agrees with a full decode (sparse rule included), and
// on any input nothing panics.
func FuzzJSONFieldReader(f *testing.F) {
	f.Add([]byte(`[1,"a",[null,{"3":4}],{"5":"x"}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v := jsonValue(data)
		exerciseReader(v, 3)
		if !json.Valid(data) {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var want any
		if err := dec.Decode(&want); err != nil {
			t.Fatal(err)
		}
		compareLazy(t, jsonValue(bytes.TrimSpace(data)), want, "$", 4)
	})
}

// exerciseReader calls every accessor on arbitrary bytes, descending into a
// few elements per level (all of them would make the harness, not the
// reader, exponential).
func exerciseReader(v jsonValue, depth int) {
	_, _ = v.str()
	_, _, _ = appendUnquoted(nil, v, 0)
	_, _ = v.int64()
	_, _ = v.float64()
	_ = v.keys()
	_ = v.key("1")
	var dst [4]jsonValue
	splitArray(v, 0, dst[:])
	if depth == 0 {
		return
	}
	for i := range 4 {
		exerciseReader(v.index(i), depth-1)
	}
	for i, e := range v.elements() {
		if i == 3 {
			break
		}
		exerciseReader(e, depth-1)
	}
}

// refIndex is index's rule on a decoded array.
func refIndex(a []any, i int) (any, bool) {
	if n := len(a); n > 0 {
		if obj, ok := a[n-1].(map[string]any); ok {
			if i < n-1 {
				return a[i], true
			}
			v, ok := obj[strconv.Itoa(i+1)]
			return v, ok
		}
	}
	if i < len(a) {
		return a[i], true
	}
	return nil, false
}

func compareLazy(t *testing.T, got jsonValue, want any, path string, depth int) {
	t.Helper()
	switch w := want.(type) {
	case nil:
		if !got.isNull() || got.present() {
			t.Fatalf("%s: %q, want null", path, got)
		}
	case bool:
		if string(got) != strconv.FormatBool(w) {
			t.Fatalf("%s: %q, want %v", path, got, w)
		}
	case string:
		if s, ok := got.str(); !ok || s != w {
			t.Fatalf("%s: str() = %q %v, want %q", path, s, ok, w)
		}
		// appendUnquoted leaves UTF-8 repair to the second parse.
		if b, end, ok := appendUnquoted([]byte("x"), got, 0); !ok || end != len(got) || string(appendValidUTF8(nil, b[1:])) != w {
			t.Fatalf("%s: appendUnquoted() = %q %d %v, want x%q %d", path, b, end, ok, w, len(got))
		}
	case json.Number:
		if f, err := strconv.ParseFloat(string(w), 64); err == nil {
			if g, ok := got.float64(); !ok || g != f {
				t.Fatalf("%s: float64() = %v %v, want %v", path, g, ok, f)
			}
		}
		if n, err := strconv.ParseInt(string(w), 10, 64); err == nil {
			if g, ok := got.int64(); !ok || g != n {
				t.Fatalf("%s: int64() = %v %v, want %v", path, g, ok, n)
			}
		}
	case []any:
		n := 0
		for i, e := range got.elements() {
			if i < len(w) && depth > 0 {
				compareLazy(t, e, w[i], path+"["+strconv.Itoa(i)+"]", depth-1)
			}
			n++
		}
		if n != len(w) {
			t.Fatalf("%s: %d elements, want %d", path, n, len(w))
		}
		var dst [6]jsonValue
		splitArray(got, 0, dst[:])
		for i := range len(dst) + 1 {
			e := got.index(i)
			ref, ok := refIndex(w, i)
			if i < len(dst) && !bytes.Equal(dst[i], e) {
				t.Fatalf("%s: splitArray()[%d] = %q, index(%d) = %q", path, i, dst[i], i, e)
			}
			// get descends without scanning the levels above the end of
			// its path, and finds the same values.
			for k := range 3 {
				if g, want := got.get(i, k), e.get(k); !bytes.Equal(g, want) || (g == nil) != (want == nil) {
					t.Fatalf("%s: get(%d, %d) = %q, index(%d).index(%d) = %q", path, i, k, g, i, k, want)
				}
			}
			if !ok {
				if e != nil {
					t.Fatalf("%s: index(%d) = %q, want absent", path, i, e)
				}
				continue
			}
			if depth > 0 {
				compareLazy(t, e, ref, path+".index("+strconv.Itoa(i)+")", depth-1)
			}
		}
	case map[string]any:
		for k, wv := range w {
			if depth > 0 {
				compareLazy(t, got.key(k), wv, path+"."+strconv.Quote(k), depth-1)
			}
		}
		keys := got.keys()
		for _, k := range keys {
			if _, ok := w[k]; !ok {
				t.Fatalf("%s: key %q not in the object", path, k)
			}
		}
		if len(w) > 0 && len(keys) == 0 {
			t.Fatalf("%s: no keys, want %d", path, len(w))
		}
	}
}
