package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// The behaviour suite (testdata/sentiment/behaviour.tsv, docs/sentiment.md):
// short cases, each testing one phenomenon, classified by the text alone.

// behaviourFloorEnforced turns the ≥ 90 % floor on. The model of issue 22
// flips this; until then TestSentimentBehaviour reports and skips.
const behaviourFloorEnforced = true

const behaviourFloor = 0.90

var behaviourLangs = map[string]bool{"fa": true, "en": true, "finglish": true}

var behaviourPhenomena = map[string]bool{
	"negation": true, "negated_intensity": true, "contrast": true, "intensifier": true,
	"neutral": true, "question": true, "emoji": true, "emoji_text": true, "mixed_script": true,
	"sarcasm": true, "simple": true, "crash": true, "ads": true, "filtering": true,
	"login": true, "payment": true, "update": true,
}

type behaviourCase struct {
	Lang, Phenomenon string
	sentItem
}

// readBehaviourTSV reads LANG<TAB>PHENOMENON<TAB>LABEL<TAB>TEXT lines, # comments.
func readBehaviourTSV(t testing.TB) []behaviourCase {
	t.Helper()
	const name = "behaviour.tsv"
	b, err := os.ReadFile(filepath.Join(sentimentTestdata, name))
	if err != nil {
		t.Fatal(err)
	}
	var cases []behaviourCase
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimRight(line, "\r"); line == "" || line[0] == '#' {
			continue
		}
		f := strings.SplitN(line, "\t", 4)
		if len(f) != 4 || strings.TrimSpace(f[3]) == "" {
			t.Fatalf("%s:%d: want LANG<TAB>PHENOMENON<TAB>LABEL<TAB>TEXT", name, i+1)
		}
		c, err := parseSentClass(f[2])
		if err != nil || !behaviourLangs[f[0]] || !behaviourPhenomena[f[1]] {
			t.Fatalf("%s:%d: unknown language, phenomenon or label: %q", name, i+1, line)
		}
		cases = append(cases, behaviourCase{Lang: f[0], Phenomenon: f[1], sentItem: sentItem{Text: f[3], Class: c}})
	}
	return cases
}

type passCount struct{ pass, total int }

func (p passCount) rate() float64 { return float64(p.pass) / float64(p.total) }

func TestSentimentBehaviour(t *testing.T) {
	m, err := loadSentimentModel()
	if err != nil {
		t.Fatal(err)
	}
	cases := readBehaviourTSV(t)
	byPhen, byLang := map[string]*passCount{}, map[string]*passCount{}
	var all passCount
	var failed strings.Builder
	for _, c := range cases {
		r := m.Classify(c.Text, 0)
		ok := r.Label == sentimentLabels[c.Class]
		for _, k := range []struct {
			m   map[string]*passCount
			key string
		}{{byPhen, c.Phenomenon}, {byLang, c.Lang}} {
			if k.m[k.key] == nil {
				k.m[k.key] = &passCount{}
			}
			k.m[k.key].total++
			if ok {
				k.m[k.key].pass++
			}
		}
		all.total++
		if ok {
			all.pass++
		} else {
			fmt.Fprintf(&failed, "  %-8s %-17s want %-8s got %-8s %q\n", c.Lang, c.Phenomenon, sentimentLabels[c.Class], r.Label, c.Text)
		}
	}
	var tbl strings.Builder
	for _, group := range []struct {
		title string
		m     map[string]*passCount
	}{{"phenomenon", byPhen}, {"language", byLang}} {
		keys := make([]string, 0, len(group.m))
		for k := range group.m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&tbl, "%-18s %6s %6s\n", group.title, "cases", "pass")
		for _, k := range keys {
			fmt.Fprintf(&tbl, "%-18s %6d %6.3f\n", k, group.m[k].total, group.m[k].rate())
		}
	}
	fmt.Fprintf(&tbl, "%-18s %6d %6.3f\n", "all", all.total, all.rate())
	t.Logf("behaviour suite, model %s, text only:\n%s", m.Version(), tbl.String())
	if testing.Verbose() {
		t.Logf("failed cases:\n%s", failed.String())
	}
	if !behaviourFloorEnforced {
		t.Skipf("floor %.2f not enforced yet (behaviourFloorEnforced); overall %.3f", behaviourFloor, all.rate())
	}
	if all.rate() < behaviourFloor {
		t.Errorf("behaviour suite: %d of %d pass (%.3f), want at least %.2f; run with -v for the failed cases", all.pass, all.total, all.rate(), behaviourFloor)
	}
}

// TestSentimentBehaviourWellFormed: enough cases of every phenomenon, at
// least 40 % Persian, and each case's language what the detector sees.
func TestSentimentBehaviourWellFormed(t *testing.T) {
	cases := readBehaviourTSV(t)
	if len(cases) < 300 {
		t.Errorf("behaviour.tsv: %d cases, want at least 300", len(cases))
	}
	perPhen, perLang := map[string]int{}, map[string]int{}
	for _, c := range cases {
		perPhen[c.Phenomenon]++
		perLang[c.Lang]++
		if c.Phenomenon == "emoji" {
			continue // emoji alone have no script
		}
		want := c.Lang
		if want == "finglish" {
			want = "en"
		}
		if got := detectSentimentLang(c.Text); got != want {
			t.Errorf("behaviour.tsv: %q is marked %s but detected as %s", c.Text, c.Lang, got)
		}
	}
	for p := range behaviourPhenomena {
		if perPhen[p] < 10 {
			t.Errorf("behaviour.tsv: %d cases of %s, want at least 10", perPhen[p], p)
		}
	}
	if 10*perLang["fa"] < 4*len(cases) {
		t.Errorf("behaviour.tsv: %d of %d cases Persian, want at least 40 %%", perLang["fa"], len(cases))
	}
}

// sentDataKey is what two texts must differ in to count as different: the
// classifier's normalisation, then letters, digits and emoji only.
func sentDataKey(text string) string {
	norm := string(normalizeSentimentText(nil, strings.TrimSpace(text)))
	return strings.Join(strings.FieldsFunc(norm, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsPunct(r)
	}), " ")
}

// sentimentDataFiles are all our labelled files; no text may be in two of
// them, nor twice in one.
var sentimentDataFiles = []string{
	"train_fa.tsv", "train_en.tsv", "train_finglish.tsv",
	"dev_fa.tsv", "dev_en.tsv",
	"behaviour.tsv",
	"xdomain_fa.tsv", "xdomain_en.tsv",
}

// sentTextsOf reads the texts of one of sentimentDataFiles.
func sentTextsOf(t *testing.T, name string) []string {
	t.Helper()
	var texts []string
	if name == "behaviour.tsv" {
		for _, c := range readBehaviourTSV(t) {
			texts = append(texts, c.Text)
		}
		return texts
	}
	for _, it := range readSentimentTSV(t, name) {
		texts = append(texts, it.Text)
	}
	return texts
}

// sentWordSet is the sorted, distinct words of a text after normalisation.
func sentWordSet(text string) []string {
	norm := string(normalizeSentimentText(nil, strings.TrimSpace(text)))
	words := strings.FieldsFunc(norm, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
	sort.Strings(words)
	return slices.Compact(words)
}

// jaccard of two sorted sets.
func jaccard(a, b []string) float64 {
	common := 0
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] == b[j]:
			common++
			i++
			j++
		case a[i] < b[j]:
			i++
		default:
			j++
		}
	}
	return float64(common) / float64(len(a)+len(b)-common)
}

// TestSentimentDataNearDuplicates: no text of an evaluation file (dev,
// behaviour, cross-domain) is a training text with a word or two changed
// or moved: word-set Jaccard below 0.75 for texts of three words or more.
func TestSentimentDataNearDuplicates(t *testing.T) {
	type text struct {
		file, text string
		words      []string
	}
	var train, eval []text
	for _, name := range sentimentDataFiles {
		for _, s := range sentTextsOf(t, name) {
			w := sentWordSet(s)
			if len(w) < 3 {
				continue
			}
			if strings.HasPrefix(name, "train_") {
				train = append(train, text{name, s, w})
			} else {
				eval = append(eval, text{name, s, w})
			}
		}
	}
	for _, e := range eval {
		for _, tr := range train {
			if j := jaccard(e.words, tr.words); j >= 0.75 {
				t.Errorf("%s: %q is close to %s: %q (Jaccard %.2f)", e.file, e.text, tr.file, tr.text, j)
			}
		}
	}
}

// TestSentimentDataDisjoint: the training files, the dev sets, the
// behaviour suite and the cross-domain sets share no text, and none holds
// a text twice.
func TestSentimentDataDisjoint(t *testing.T) {
	seen := map[string]string{}
	for _, name := range sentimentDataFiles {
		for _, text := range sentTextsOf(t, name) {
			k := sentDataKey(text)
			if prev, ok := seen[k]; ok {
				t.Errorf("%s: %q is already in %s", name, text, prev)
				continue
			}
			seen[k] = name
		}
	}
}

// TestSentimentDataShape: the sizes issue 22 asks of our own data, a
// quarter neutral at least, and each file in the language it says.
func TestSentimentDataShape(t *testing.T) {
	for _, f := range []struct {
		name     string
		min      int
		lang     string // what detectSentimentLang must say of every text
		neutral4 bool   // at least a quarter NEUTRAL
	}{
		{"train_fa.tsv", 2000, "fa", true},
		{"train_finglish.tsv", 300, "en", true},
		{"train_en.tsv", 1000, "en", true},
		{"xdomain_fa.tsv", 300, "fa", true},
		{"xdomain_en.tsv", 300, "en", true},
	} {
		items := readSentimentTSV(t, f.name)
		var per [sentClasses]int
		for _, it := range items {
			per[it.Class]++
			if got := detectSentimentLang(it.Text); got != f.lang && got != "other" {
				t.Errorf("%s: %q is detected as %s, want %s", f.name, it.Text, got, f.lang)
			}
		}
		t.Logf("%s: %d rows: %d negative, %d neutral, %d positive", f.name, len(items), per[classNegative], per[classNeutral], per[classPositive])
		if len(items) < f.min {
			t.Errorf("%s: %d rows, want at least %d", f.name, len(items), f.min)
		}
		if f.neutral4 && 4*per[classNeutral] < len(items) {
			t.Errorf("%s: %d of %d rows NEUTRAL, want at least a quarter", f.name, per[classNeutral], len(items))
		}
		if per[classNegative] == 0 || per[classPositive] == 0 {
			t.Errorf("%s: want both polar classes", f.name)
		}
	}
}
