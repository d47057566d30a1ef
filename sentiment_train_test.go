package main

import (
	"math"
	"os"
	"slices"
	"sort"
	"testing"
)

// TestTrainSentiment is the trainer (make train-sentiment, docs/sentiment.md
// §3.1). It lives in a test file so that it shares the feature code with
// the product without shipping in the binary. It rewrites
// sentiment_model.bin.gz; the same inputs give the same bytes.
func TestTrainSentiment(t *testing.T) {
	if os.Getenv("PLAYWATCH_TRAIN_SENTIMENT") != "1" {
		t.Skip("the trainer runs with make train-sentiment (PLAYWATCH_TRAIN_SENTIMENT=1)")
	}
	lex := vaderLexicon(t)
	m, err := newSentimentModel(nil, [sentClasses]float32{}, lex)
	if err != nil {
		t.Fatal(err)
	}
	data := sentimentTrainingSet(t, m, "")
	w, bias := trainSentiment(data, nil, trainEpochs)
	shift := calibrateNeutral(t, m, lex)
	applyNeutralBand(w, shift)
	t.Logf("neutral band: texts without a lexicon word lean neutral by %+.2f more (calibrated across domains)", shift)
	file := encodeSentimentModel(w, bias, lex)
	if err := os.WriteFile("sentiment_model.bin.gz", file, 0o644); err != nil {
		t.Fatal(err)
	}
	var counts [sentClasses]int
	for _, ex := range data {
		counts[ex.class]++
	}
	t.Logf("trained on %d texts (negative %d, neutral %d, positive %d); model file %d bytes", len(data), counts[0], counts[1], counts[2], len(file))
}

// sentimentTrainingSet is everything the model learns from: the UCI
// sentences and the recorded Play Store reviews outside their held-out
// fifth, and our own training sentences (disjoint from the dev sets);
// without the source named exclude, for the cross-domain table of the
// evaluation (sentimentTrainingSources).
func sentimentTrainingSet(t *testing.T, m *sentimentModel, exclude string) []trainExample {
	var items []struct {
		sentItem
		lang   string
		weight float64
	}
	add := func(set []sentItem, lang string, weight float64, heldOutSplit bool) {
		for _, it := range set {
			if heldOutSplit && sentHeldOut(it.Text) {
				continue
			}
			l := lang
			if l == "" {
				if l = detectSentimentLang(it.Text); l == "other" {
					continue
				}
			}
			items = append(items, struct {
				sentItem
				lang   string
				weight float64
			}{it, l, weight})
		}
	}
	for _, src := range sentimentTrainingSources(t) {
		if src.name != exclude {
			add(src.items, src.lang, src.weight, src.heldOutSplit)
		}
	}

	var perClass [sentClasses]float64
	for _, it := range items {
		perClass[it.Class] += it.weight
	}
	total := perClass[0] + perClass[1] + perClass[2]
	out := make([]trainExample, 0, len(items))
	for _, it := range items {
		balance := math.Min(total/(sentClasses*perClass[it.Class]), 3)
		out = append(out, trainExample{feats: m.features(it.Text, it.lang), class: it.Class, weight: it.weight * balance})
	}
	return out
}

// trainSource is one data set the trainer learns from.
type trainSource struct {
	name         string
	lang         string // "" decides per text
	items        []sentItem
	weight       float64
	heldOutSplit bool // a fifth by hash is kept out for the evaluation
}

func sentimentTrainingSources(t *testing.T) []trainSource {
	uci := uciSentences(t)
	names := make([]string, 0, len(uci))
	for name := range uci {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []trainSource
	for _, name := range names {
		out = append(out, trainSource{name, "en", uci[name], 1, true})
	}
	return append(out,
		trainSource{"playstore", "", playstoreSentimentItems(t), 1, true},
		trainSource{"train_en", "", readSentimentTSV(t, "train_en.tsv"), 1.5, false},
		trainSource{"train_fa", "fa", readSentimentTSV(t, "train_fa.tsv"), 2, false},
		trainSource{"train_finglish", "", readSentimentTSV(t, "train_finglish.tsv"), 2, false},
	)
}

// neutralSources are the training sources with neutral gold, across which
// the neutral band is calibrated.
var neutralSources = []string{"playstore", "train_en", "train_fa", "train_finglish"}

// applyNeutralBand moves the neutral weight of dNoLex, the feature of a
// text with no word of the lexicon: the neutral band widens where the
// lexicon has nothing to say, and leaves "بد نیست" or "not bad" alone.
func applyNeutralBand(w []float32, shift float64) {
	w[dNoLex*sentClasses+classNeutral] += float32(shift)
}

// calibrateNeutral is the neutral band: the shift of the neutral weight
// of texts without a lexicon word (applyNeutralBand) that gives the best mean 3-class macro-F1 when each source with
// neutral gold is predicted by a model trained without it. A model always
// meets texts of a domain it was not trained on, and there it is
// overconfident; this makes it say NEUTRAL where it should.
func calibrateNeutral(t *testing.T, base *sentimentModel, lex map[string]float32) float64 {
	type fold struct {
		w     []float32
		bias  [sentClasses]float32
		items []sentItem
		lang  string
	}
	var folds []fold
	for _, src := range sentimentTrainingSources(t) {
		if !slices.Contains(neutralSources, src.name) {
			continue
		}
		w, bias := trainSentiment(sentimentTrainingSet(t, base, src.name), nil, trainEpochs)
		folds = append(folds, fold{w, bias, src.items, src.lang})
	}
	best, bestF1 := 0.0, -1.0
	for step := -5; step <= 25; step++ {
		shift := float64(step) / 10
		sum := 0.0
		for _, f := range folds {
			w := slices.Clone(f.w)
			applyNeutralBand(w, shift)
			m, err := newSentimentModel(w, f.bias, lex)
			if err != nil {
				t.Fatal(err)
			}
			sum += evalTexts(m, f.items, f.lang).macroF1()
		}
		if f1 := sum / float64(len(folds)); f1 > bestF1+1e-9 {
			best, bestF1 = shift, f1
		}
	}
	return best
}
