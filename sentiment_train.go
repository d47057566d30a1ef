package main

import (
	"bytes"
	"compress/gzip"
	"embed"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
)

// The sentiment trainer and its measures, in the binary: make
// train-sentiment (sentiment_train_test.go) trains the embedded model with
// them, and `playwatch sentiment adapt` (sentiment_adapt.go) goes on from
// it with the user's own reviews, checked on the project's dev sets, which
// are embedded for that.

//go:embed testdata/sentiment/dev_fa.tsv testdata/sentiment/dev_en.tsv
var sentimentDevFiles embed.FS

// sentimentDevSets are the project's dev sets by language (docs/sentiment.md §5).
func sentimentDevSets() (map[string][]sentItem, error) {
	out := map[string][]sentItem{}
	for _, lang := range []string{"fa", "en"} {
		name := "dev_" + lang + ".tsv"
		b, err := sentimentDevFiles.ReadFile("testdata/sentiment/" + name)
		if err != nil {
			return nil, err
		}
		if out[lang], err = parseSentimentTSV(name, b); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// sentItem is one labelled text; Stars is 0 where the set has none.
type sentItem struct {
	Text  string
	Class int
	Stars int
}

func parseSentClass(s string) (int, error) {
	switch s {
	case "POSITIVE":
		return classPositive, nil
	case "NEUTRAL":
		return classNeutral, nil
	case "NEGATIVE":
		return classNegative, nil
	}
	return 0, fmt.Errorf("unknown label %q", s)
}

// starClass is the weak label of a star rating: 1–2 negative, 3 neutral, 4–5 positive.
func starClass(stars int) int {
	switch {
	case stars <= 2:
		return classNegative
	case stars == 3:
		return classNeutral
	}
	return classPositive
}

// parseSentimentTSV reads a set of ours: LABEL<TAB>STARS<TAB>TEXT lines
// (STARS 0 for none), # comments.
func parseSentimentTSV(name string, b []byte) ([]sentItem, error) {
	var items []sentItem
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimRight(line, "\r"); line == "" || line[0] == '#' {
			continue
		}
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			return nil, fmt.Errorf("%s:%d: want LABEL<TAB>STARS<TAB>TEXT", name, i+1)
		}
		c, err := parseSentClass(f[0])
		stars, err2 := strconv.Atoi(f[1])
		if err != nil || err2 != nil || stars < 0 || stars > 5 {
			return nil, fmt.Errorf("%s:%d: bad label or stars: %q", name, i+1, line)
		}
		items = append(items, sentItem{Text: f[2], Class: c, Stars: stars})
	}
	return items, nil
}

// trainExample is one text's features and label; weight balances the
// classes and the sources.
type trainExample struct {
	feats  []sentFeature
	class  int
	weight float64
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

// trainSentiment trains from zero (init nil) or goes on from init's weights
// (adapt), for the given number of epochs. Going on, only the hashed
// features learn: the user's vocabulary is what the reviews teach, while
// the biases and the dense lexicon features keep the calibration the
// project's data gave them.
func trainSentiment(data []trainExample, init *sentimentModel, epochs int) ([]float32, [sentClasses]float32) {
	w := make([]float64, sentFeatureCount*sentClasses)
	g2 := make([]float64, len(w))
	var bias, bg2 [sentClasses]float64
	if init != nil {
		for i, v := range init.w {
			w[i] = float64(v)
		}
		for c, v := range init.bias {
			bias[c] = float64(v)
		}
	}
	rng := rand.New(rand.NewPCG(1, 0x5e47))
	order := make([]int, len(data))
	for i := range order {
		order[i] = i
	}
	for range epochs {
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
				if init == nil {
					bg2[c] += g * g
					bias[c] -= trainRate * g / math.Sqrt(bg2[c]+1e-8)
				}
				for _, f := range ex.feats {
					if init != nil && f.idx >= sentBuckets {
						continue
					}
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

// sentEval is what one method predicted on one set.
type sentEval struct {
	confusion [sentClasses][sentClasses]int // [gold][predicted]
	binary    [2][2]int                     // gold pos/neg items: [gold][predicted], 0 negative 1 positive
}

// add records one prediction; pPos and pNeg decide a NEUTRAL prediction on
// an item whose gold label is positive or negative.
func (e *sentEval) add(gold, pred int, pPos, pNeg float64) {
	e.confusion[gold][pred]++
	if gold == classNeutral {
		return
	}
	b := 0
	if pred == classPositive || (pred == classNeutral && pPos >= pNeg) {
		b = 1
	}
	e.binary[min(gold, 1)][b]++
}

func f1(tp, fp, fn int) float64 {
	if tp == 0 {
		return 0
	}
	return 2 * float64(tp) / float64(2*tp+fp+fn)
}

// macroF1 is the 3-class macro-F1 (docs/sentiment.md §5): the mean F1 of
// the classes that occur in the gold labels or the predictions, the usual
// reading (scikit-learn's default labels). On a set without neutral gold,
// the neutral class still counts, with F1 0, once anything is predicted
// neutral; a class neither in the gold nor ever predicted has no F1 at all
// and is left out rather than counted as a perfect or a zero score.
func (e *sentEval) macroF1() float64 {
	sum, n := 0.0, 0
	for c := range sentClasses {
		if f, ok := e.classF1(c); ok {
			sum += f
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// classF1 is class c's F1 from the confusion matrix; not ok for a class
// neither in the gold labels nor predicted.
func (e *sentEval) classF1(c int) (f float64, ok bool) {
	tp, fp, fn := e.confusion[c][c], 0, 0
	for o := range sentClasses {
		if o != c {
			fp += e.confusion[o][c]
			fn += e.confusion[c][o]
		}
	}
	return f1(tp, fp, fn), tp+fp+fn > 0
}

func (e *sentEval) binaryF1() float64 {
	b := e.binary
	return (f1(b[0][0], b[1][0], b[0][1]) + f1(b[1][1], b[0][1], b[1][0])) / 2
}
