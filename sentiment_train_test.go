package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
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
	data := sentimentTrainingSet(t, m)
	w, bias := trainSentiment(data, 1)
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

// trainExample is one text's features and label; weight balances the
// classes and the sources.
type trainExample struct {
	feats  []sentFeature
	class  int
	weight float64
}

// sentimentTrainingSet is everything the model learns from: the UCI
// sentences and the recorded Play Store reviews outside their held-out
// fifth, and our own training sentences (disjoint from the dev sets).
func sentimentTrainingSet(t *testing.T, m *sentimentModel) []trainExample {
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
	uci := uciSentences(t)
	names := make([]string, 0, len(uci))
	for name := range uci {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		add(uci[name], "en", 1, true)
	}
	add(playstoreSentimentItems(t), "", 1, true)
	add(readSentimentTSV(t, "train_en.tsv"), "", 1.5, false)
	add(readSentimentTSV(t, "train_fa.tsv"), "fa", 2, false)

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

// features is the feature vector Classify computes for text in lang.
func (m *sentimentModel) features(text, lang string) []sentFeature {
	sc := &sentScratch{}
	m.textFeatures(sc, text, lang)
	return sc.feats
}

// Training settings: AdaGrad on the weighted cross-entropy with an L2 pull
// on every weight it touches; examples shuffled by a fixed seed.
const (
	trainEpochs = 12
	trainRate   = 0.2
	trainL2     = 1e-4
)

func trainSentiment(data []trainExample, seed uint64) ([]float32, [sentClasses]float32) {
	w := make([]float64, sentFeatureCount*sentClasses)
	g2 := make([]float64, len(w))
	var bias, bg2 [sentClasses]float64
	rng := rand.New(rand.NewPCG(seed, 0x5e47))
	order := make([]int, len(data))
	for i := range order {
		order[i] = i
	}
	for range trainEpochs {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			ex := data[k]
			var z [sentClasses]float32
			for c := range z {
				z[c] = float32(bias[c])
			}
			for _, f := range ex.feats {
				for c := range z {
					z[c] += f.v * float32(w[int(f.idx)*sentClasses+c])
				}
			}
			p := softmax3(z)
			for c := range p {
				g := p[c]
				if c == ex.class {
					g--
				}
				g *= ex.weight
				bg2[c] += g * g
				bias[c] -= trainRate * g / math.Sqrt(bg2[c]+1e-8)
				for _, f := range ex.feats {
					i := int(f.idx)*sentClasses + c
					gi := g*float64(f.v) + trainL2*w[i]
					g2[i] += gi * gi
					w[i] -= trainRate * gi / math.Sqrt(g2[i]+1e-8)
				}
			}
		}
	}
	out := make([]float32, len(w))
	for i, v := range w {
		out[i] = float32(v)
	}
	var b [sentClasses]float32
	for c := range b {
		b[c] = float32(bias[c])
	}
	return quantizeWeights(out), b
}

// quantizeWeights rounds the weights as the file stores them, so the model
// the trainer reports on is the one it writes.
func quantizeWeights(w []float32) []float32 {
	scale := weightScale(w)
	for i, v := range w {
		w[i] = float32(math.Round(float64(v/scale))) * scale
	}
	return w
}

func weightScale(w []float32) float32 {
	var hi float32
	for _, v := range w {
		hi = max(hi, float32(math.Abs(float64(v))))
	}
	if hi == 0 {
		return 1
	}
	return hi / 32767
}

// encodeSentimentModel writes the format decodeSentimentModel reads; the
// lexicon sorted, the gzip header without a time, so the bytes depend on
// the weights alone.
func encodeSentimentModel(w []float32, bias [sentClasses]float32, lex map[string]float32) []byte {
	var raw bytes.Buffer
	raw.WriteString(sentimentModelMagic)
	scale := weightScale(w)
	hdr := struct {
		Features, Classes uint32
		Scale             float32
		Bias              [sentClasses]float32
	}{sentFeatureCount, sentClasses, scale, bias}
	_ = binary.Write(&raw, binary.LittleEndian, hdr)
	q := make([]int16, len(w))
	for i, v := range w {
		q[i] = int16(math.Round(float64(v / scale)))
	}
	_ = binary.Write(&raw, binary.LittleEndian, q)
	words := make([]string, 0, len(lex))
	for k := range lex {
		if len(k) < 256 {
			words = append(words, k)
		}
	}
	sort.Strings(words)
	_ = binary.Write(&raw, binary.LittleEndian, uint32(len(words)))
	for _, k := range words {
		raw.WriteByte(byte(len(k)))
		raw.WriteString(k)
		_ = binary.Write(&raw, binary.LittleEndian, lex[k])
	}
	var out bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
	_, _ = zw.Write(raw.Bytes())
	_ = zw.Close()
	return out.Bytes()
}
