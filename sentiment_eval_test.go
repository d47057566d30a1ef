package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The evaluation of the sentiment labels (make eval-sentiment,
// docs/sentiment.md §5) and the quality floor every test run checks.

// label is the lexicon-only baseline: VADER's thresholds on the compound.
func (l lexiconScore) label() int {
	switch c := l.compound(); {
	case c >= 0.05:
		return classPositive
	case c <= -0.05:
		return classNegative
	}
	return classNeutral
}

// sentMethods are the four readings the evaluation compares.
var sentMethods = []string{"star-only", "lexicon-only", "text model", "fused (stored)"}

// evaluateSentiment runs every method over a set; star-only and fused are
// left out (nil) when the set has no ratings.
func evaluateSentiment(m *sentimentModel, items []sentItem) []*sentEval {
	out := make([]*sentEval, len(sentMethods))
	hasStars := false
	for _, it := range items {
		hasStars = hasStars || it.Stars > 0
	}
	for i := range out {
		if hasStars || (i != 0 && i != 3) {
			out[i] = &sentEval{}
		}
	}
	for _, it := range items {
		lang := detectSentimentLang(it.Text)
		if out[0] != nil {
			p := starEvidence[it.Stars]
			star := classNeutral
			if it.Stars > 0 {
				star = starClass(it.Stars)
			}
			out[0].add(it.Class, star, p[classPositive], p[classNegative])
		}
		lexLabel, compound := classNeutral, 0.0
		if lang != "other" {
			_, l := m.textProbabilities(it.Text, lang)
			lexLabel, compound = l.label(), l.compound()
		}
		out[1].add(it.Class, lexLabel, compound, -compound)
		r := m.classifyAs(it.Text, 0, lang)
		out[2].add(it.Class, classOfLabel(r.Label), r.PPositive, r.PNegative)
		if out[3] != nil {
			r := m.classifyAs(it.Text, it.Stars, lang)
			out[3].add(it.Class, classOfLabel(r.Label), r.PPositive, r.PNegative)
		}
	}
	return out
}

// evalTexts is m's evaluation on the texts of items alone (no stars), each
// read as lang, or as its detected language when lang is "".
func evalTexts(m *sentimentModel, items []sentItem, lang string) *sentEval {
	e := &sentEval{}
	for _, it := range items {
		l := lang
		if l == "" {
			l = detectSentimentLang(it.Text)
		}
		r := m.classifyAs(it.Text, 0, l)
		e.add(it.Class, classOfLabel(r.Label), r.PPositive, r.PNegative)
	}
	return e
}

// goldCounts is how many of items are of each class.
func goldCounts(items []sentItem) [sentClasses]int {
	var gold [sentClasses]int
	for _, it := range items {
		gold[it.Class]++
	}
	return gold
}

func printSentimentEval(w io.Writer, name, lang string, items []sentItem, evals []*sentEval) {
	gold := goldCounts(items)
	fmt.Fprintf(w, "\n== %s (%s): %d items, gold NEG %d / NEU %d / POS %d\n", name, lang, len(items), gold[0], gold[1], gold[2])
	fmt.Fprintf(w, "%-15s %9s %9s   %-17s   confusion, rows gold NEG/NEU/POS, columns predicted\n", "method", "3-class", "binary", "F1 NEG/NEU/POS")
	for i, e := range evals {
		if e == nil {
			fmt.Fprintf(w, "%-15s %9s %9s   (the set has no star ratings)\n", sentMethods[i], "-", "-")
			continue
		}
		c := e.confusion
		fmt.Fprintf(w, "%-15s %9.3f %9.3f   %-17s   %v %v %v\n", sentMethods[i], e.macroF1(), e.binaryF1(), e.classF1s(), c[0], c[1], c[2])
	}
}

// readSentiFars reads the SentiFars hotel reviews (stars<TAB>text, a header
// line); the gold label is the stars' class.
func readSentiFars(path string) ([]sentItem, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var items []sentItem
	s := bufio.NewScanner(f)
	s.Buffer(nil, 1<<20)
	for n := 1; s.Scan(); n++ {
		stars, text, ok := strings.Cut(s.Text(), "\t")
		if n == 1 || !ok {
			continue
		}
		v, err := strconv.Atoi(stars)
		if err != nil || v < 1 || v > 5 {
			return nil, fmt.Errorf("%s:%d: bad stars %q", path, n, stars)
		}
		items = append(items, sentItem{Text: text, Class: starClass(v), Stars: v})
	}
	return items, s.Err()
}

func TestEvalSentiment(t *testing.T) {
	if os.Getenv("PLAYWATCH_EVAL_SENTIMENT") != "1" {
		t.Skip("the evaluation runs with make eval-sentiment (PLAYWATCH_EVAL_SENTIMENT=1)")
	}
	m, err := loadSentimentModel()
	if err != nil {
		t.Fatal(err)
	}
	w := os.Stdout
	fmt.Fprintf(w, "sentiment model %s\n", m.Version())
	heldOut := func(items []sentItem) []sentItem {
		var out []sentItem
		for _, it := range items {
			if sentHeldOut(it.Text) {
				out = append(out, it)
			}
		}
		return out
	}
	type set struct {
		name, lang string
		items      []sentItem
	}
	sets := []set{
		{"dev-fa (ours, written for the project)", "fa", readSentimentTSV(t, "dev_fa.tsv")},
		{"dev-en (ours, written for the project)", "en", readSentimentTSV(t, "dev_en.tsv")},
	}
	uci := uciSentences(t)
	for _, name := range []string{"uci-amazon", "uci-imdb", "uci-yelp"} {
		sets = append(sets, set{name + " held-out fifth (no neutral gold, no stars)", "en", heldOut(uci[name])})
	}
	sets = append(sets, set{"playstore recorded reviews, held-out fifth (gold = stars)", "en", heldOut(playstoreSentimentItems(t))})
	if path := os.Getenv("SENTIFARS"); path == "" {
		fmt.Fprintln(w, "\n== SentiFars hotel reviews: skipped (SENTIFARS is empty)")
	} else if items, err := readSentiFars(path); err != nil {
		fmt.Fprintf(w, "\n== SentiFars hotel reviews: skipped (%v)\n", err)
	} else {
		sets = append(sets, set{"SentiFars hotel reviews (gold = stars, out of domain)", "fa", items})
	}
	for _, x := range []string{"fa", "en"} {
		name := "xdomain_" + x + ".tsv"
		if _, err := os.Stat(filepath.Join(sentimentTestdata, name)); err == nil {
			sets = append(sets, set{name + " (ours, other domains, never trained on)", x, readSentimentTSV(t, name)})
		}
	}
	for _, s := range sets {
		printSentimentEval(w, s.name, s.lang, s.items, evaluateSentiment(m, s.items))
	}
	printBehaviourPassRate(w, m, readBehaviourTSV(t))
	printCrossDomain(t, w)
}

// printBehaviourPassRate prints the behaviour suite's pass rate per language.
func printBehaviourPassRate(w io.Writer, m *sentimentModel, cases []behaviourCase) {
	byLang := map[string]*passCount{}
	var all passCount
	for _, c := range cases {
		ok := m.Classify(c.Text, 0).Label == sentimentLabels[c.Class]
		for _, p := range []*passCount{&all, byLang[c.Lang]} {
			if p == nil {
				p = &passCount{}
				byLang[c.Lang] = p
			}
			p.total++
			if ok {
				p.pass++
			}
		}
	}
	fmt.Fprintf(w, "\n== behaviour suite (text only): %d of %d pass (%.3f);", all.pass, all.total, all.rate())
	for _, l := range []string{"fa", "en", "finglish"} {
		if p := byLang[l]; p != nil {
			fmt.Fprintf(w, " %s %.3f", l, p.rate())
		}
	}
	fmt.Fprintln(w)
}

// printCrossDomain is the cross-domain table: each training source held
// out in turn, the model trained again without it (same settings as make
// train-sentiment) and measured on all of it, text only.
func printCrossDomain(t *testing.T, w io.Writer) {
	lex := vaderLexicon(t)
	base, err := newSentimentModel(nil, [sentClasses]float32{}, lex)
	if err != nil {
		t.Fatal(err)
	}
	shift := calibrateNeutral(t, base, lex)
	fmt.Fprintf(w, "\n== cross-domain: each set held out in turn (trained without it, tested on all of it, text model; neutral band %+.2f as shipped)\n", shift)
	fmt.Fprintf(w, "%-12s %6s %-18s %9s %9s   confusion, rows gold NEG/NEU/POS\n", "held out", "items", "gold NEG/NEU/POS", "3-class", "binary")
	for _, src := range sentimentTrainingSources(t) {
		wts, bias := trainSentiment(sentimentTrainingSet(t, base, src.name), nil, trainEpochs)
		applyNeutralBand(wts, shift)
		m, err := newSentimentModel(wts, bias, lex)
		if err != nil {
			t.Fatal(err)
		}
		e := evalTexts(m, src.items, src.lang)
		gold := goldCounts(src.items)
		c := e.confusion
		fmt.Fprintf(w, "%-12s %6d %-18s %9.3f %9.3f   %v %v %v\n", src.name, len(src.items), fmt.Sprintf("%d/%d/%d", gold[0], gold[1], gold[2]), e.macroF1(), e.binaryF1(), c[0], c[1], c[2])
	}
}

// sentimentQualityFloors are a little below what the model reaches on our
// dev sets (docs/sentiment.md §5), so that a broken model or rule fails.
var sentimentQualityFloors = map[string][2]float64{ // text model: 3-class, binary
	"dev_fa.tsv":     {0.85, 0.90}, // reached 0.901, 0.941
	"dev_en.tsv":     {0.85, 0.90}, // reached 0.910, 0.941
	"xdomain_fa.tsv": {0.75, 0.85}, // reached 0.798, 0.900: other domains, never trained on
	"xdomain_en.tsv": {0.62, 0.78}, // reached 0.660, 0.819
}

func TestSentimentDevQuality(t *testing.T) {
	m, err := loadSentimentModel()
	if err != nil {
		t.Fatal(err)
	}
	for name, floor := range sentimentQualityFloors {
		items := readSentimentTSV(t, name)
		evals := evaluateSentiment(m, items)
		text, fused := evals[2], evals[3]
		t.Logf("%s: text model 3-class %.3f binary %.3f; fused 3-class %.3f", name, text.macroF1(), text.binaryF1(), fused.macroF1())
		if text.macroF1() < floor[0] || text.binaryF1() < floor[1] {
			t.Errorf("%s: text model 3-class macro-F1 %.3f, binary %.3f; want at least %.2f and %.2f", name, text.macroF1(), text.binaryF1(), floor[0], floor[1])
		}
		if fused.macroF1() < text.macroF1() {
			t.Errorf("%s: the fused label (%.3f) is worse than the text alone (%.3f)", name, fused.macroF1(), text.macroF1())
		}
	}
}

// TestSentimentDevDisjoint: no dev sentence is a training sentence.
func TestSentimentDevDisjoint(t *testing.T) {
	for _, lang := range []string{"fa", "en"} {
		train := map[string]bool{}
		for _, it := range readSentimentTSV(t, "train_"+lang+".tsv") {
			train[string(normalizeSentimentText(nil, strings.TrimSpace(it.Text)))] = true
		}
		for _, it := range readSentimentTSV(t, "dev_"+lang+".tsv") {
			if train[string(normalizeSentimentText(nil, strings.TrimSpace(it.Text)))] {
				t.Errorf("dev_%s.tsv holds a training sentence: %q", lang, it.Text)
			}
		}
	}
}

// classF1s is each class's F1, "-" for a class neither in the gold labels
// nor predicted.
func (e *sentEval) classF1s() string {
	var parts []string
	for c := range sentClasses {
		if f, ok := e.classF1(c); ok {
			parts = append(parts, fmt.Sprintf("%.2f", f))
		} else {
			parts = append(parts, "-")
		}
	}
	return strings.Join(parts, "/")
}
