package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"unicode"
)

// The sentiment classifier (docs/sentiment.md): a multinomial logistic
// regression over the features of sentiment_features.go, trained by
// sentiment_train_test.go into sentiment_model.bin.gz, and the rule that
// combines its probabilities with a review's star rating (§4).

//go:embed sentiment_model.bin.gz
var sentimentModelFile []byte

// sentimentLexiconFile is the project's own lexicon: Persian, Finglish and
// emoji valences (docs/sentiment.md §2.3).
//
//go:embed sentiment_lexicon.txt
var sentimentLexiconFile []byte

// The classes in the model's order.
const (
	classNegative = iota
	classNeutral
	classPositive
	sentClasses
)

var sentimentLabels = [sentClasses]string{"NEGATIVE", "NEUTRAL", "POSITIVE"}

// sentimentResult is one classification.
type sentimentResult struct {
	Label     string // "POSITIVE", "NEUTRAL" or "NEGATIVE"
	Lang      string // "fa", "en" or "other"
	PPositive float64
	PNeutral  float64
	PNegative float64
}

// sentimentModel is the decoded model; read-only once built, so safe for
// concurrent use.
type sentimentModel struct {
	version string
	w       []float32 // sentFeatureCount × sentClasses, feature-major
	bias    [sentClasses]float32
	lex     map[string]float32 // one word → valence (VADER's English scale, -4..4)
	lex2    map[string]float32 // "word word" → valence
	en      map[string]float32 // the English lexicon of the file, for a model trained from this one
	pool    sync.Pool          // *sentScratch
}

const sentimentModelMagic = "PWSENT1\n"

// loadSentimentModel decodes the model embedded with go:embed (no file, no network).
func loadSentimentModel() (*sentimentModel, error) {
	m, err := sentimentModelOf(sentimentModelFile)
	if err != nil {
		return nil, fmt.Errorf("embedded sentiment model: %w", err)
	}
	return m, nil
}

// sentimentModelOf decodes a model file, the embedded one or one `sentiment
// adapt` stored, and names it by its bytes and the lexicon's.
func sentimentModelOf(file []byte) (*sentimentModel, error) {
	m, err := decodeSentimentModel(file)
	if err != nil {
		return nil, err
	}
	m.version = sentimentModelVersion(file)
	return m, nil
}

func sentimentModelVersion(file []byte) string {
	sum := sha256.New()
	sum.Write(file)
	sum.Write(sentimentLexiconFile)
	return "lr1-" + hex.EncodeToString(sum.Sum(nil))[:12]
}

// decodeSentimentModel reads the file format of docs/sentiment.md §3.2:
// gzip of the magic, the feature and class counts, a weight scale, the
// biases, the weights as int16 multiples of the scale, and the English
// lexicon as (length, word, valence) entries.
func decodeSentimentModel(file []byte) (*sentimentModel, error) {
	zr, err := gzip.NewReader(bytes.NewReader(file))
	if err != nil {
		return nil, err
	}
	r := bufio.NewReader(zr)
	magic := make([]byte, len(sentimentModelMagic))
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != sentimentModelMagic {
		return nil, errors.New("not a sentiment model file")
	}
	var hdr struct {
		Features, Classes uint32
		Scale             float32
		Bias              [sentClasses]float32
	}
	if err := binary.Read(r, binary.LittleEndian, &hdr); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if hdr.Features != sentFeatureCount || hdr.Classes != sentClasses {
		return nil, fmt.Errorf("model has %d features × %d classes, this build needs %d × %d", hdr.Features, hdr.Classes, sentFeatureCount, sentClasses)
	}
	q := make([]int16, sentFeatureCount*sentClasses)
	if err := binary.Read(r, binary.LittleEndian, q); err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	w := make([]float32, len(q))
	for i, v := range q {
		w[i] = float32(v) * hdr.Scale
	}
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return nil, fmt.Errorf("lexicon: %w", err)
	}
	en := make(map[string]float32, n)
	for range n {
		k, err := r.ReadByte()
		if err != nil {
			return nil, fmt.Errorf("lexicon: %w", err)
		}
		word := make([]byte, k)
		var v float32
		if _, err := io.ReadFull(r, word); err != nil {
			return nil, fmt.Errorf("lexicon: %w", err)
		}
		if err := binary.Read(r, binary.LittleEndian, &v); err != nil {
			return nil, fmt.Errorf("lexicon: %w", err)
		}
		en[string(word)] = v
	}
	return newSentimentModel(w, hdr.Bias, en)
}

// newSentimentModel joins the weights, the English lexicon and the
// project's own lexicon file, whose entries win.
func newSentimentModel(w []float32, bias [sentClasses]float32, en map[string]float32) (*sentimentModel, error) {
	m := &sentimentModel{w: w, bias: bias, lex: map[string]float32{}, lex2: map[string]float32{}, en: en}
	m.pool.New = func() any { return &sentScratch{} }
	for k, v := range en {
		m.lex[k] = v
	}
	sc := &sentScratch{}
	for i, line := range strings.Split(string(sentimentLexiconFile), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		word, val, ok := strings.Cut(line, "\t")
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 32)
		if !ok || err != nil {
			return nil, fmt.Errorf("sentiment_lexicon.txt line %d: want word<TAB>valence, got %q", i+1, line)
		}
		sc.norm = normalizeSentimentText(sc.norm[:0], word)
		tokenizeSentiment(sc)
		switch len(sc.toks) {
		case 1:
			m.lex[string(sc.tb)] = float32(v)
		case 2:
			m.lex2[string(sc.tb[sc.toks[0].s:sc.toks[0].e])+" "+string(sc.tb[sc.toks[1].s:sc.toks[1].e])] = float32(v)
		default:
			return nil, fmt.Errorf("sentiment_lexicon.txt line %d: %q is not one or two words", i+1, word)
		}
	}
	return m, nil
}

// Version names the model; it changes whenever the embedded weights or rules change
// (e.g. "lr1-" + first 12 hex digits of the SHA-256 of the embedded model file). At most 40 bytes.
func (m *sentimentModel) Version() string { return m.version }

// Classify labels one review. stars is the review's star rating 1..5, or 0 for none (text only).
// Safe for concurrent use; no allocation-heavy work per call beyond what the bench allows (>= 20k/s on one core).
func (m *sentimentModel) Classify(text string, stars int) sentimentResult {
	return m.classifyAs(text, stars, detectSentimentLang(text))
}

// classifyAs is Classify with the language given: "fa" or "en" run the
// text model, "other" leaves the label to the stars alone.
func (m *sentimentModel) classifyAs(text string, stars int, lang string) sentimentResult {
	var p [sentClasses]float64
	if lang == "other" {
		if !m.hasEmojiSentiment(text) {
			return fuseSentiment([sentClasses]float64{0, 1, 0}, stars, lang)
		}
		// Emoji read the same in every script (😍😍😍, 😡, "좋아요 👍"):
		// the text model reads them, with the English bias.
		p, _ = m.textProbabilities(text, "en")
		r := fuseSentiment(p, stars, "en")
		r.Lang = lang
		return r
	}
	p, _ = m.textProbabilities(text, lang)
	return fuseSentiment(p, stars, lang)
}

// hasEmojiSentiment tells whether text holds an emoji of the lexicon.
func (m *sentimentModel) hasEmojiSentiment(text string) bool {
	for _, r := range text {
		if isSentimentEmoji(r) {
			if _, ok := m.lex[string(r)]; ok {
				return true
			}
		}
	}
	return false
}

// textProbabilities runs the text model; the lexicon score comes along for
// the lexicon-only baseline of the evaluation.
func (m *sentimentModel) textProbabilities(text, lang string) ([sentClasses]float64, lexiconScore) {
	sc := m.pool.Get().(*sentScratch)
	defer m.pool.Put(sc)
	l := m.textFeatures(sc, text, lang)
	if !hasSentimentWords(sc) {
		return [sentClasses]float64{0, 1, 0}, lexiconScore{} // no words, no emoji: nothing to read
	}
	z := m.bias
	for _, f := range sc.feats {
		row := m.w[int(f.idx)*sentClasses : int(f.idx)*sentClasses+sentClasses]
		for c := range z {
			z[c] += f.v * row[c]
		}
	}
	return blendLexicon(softmax3(z), l), l
}

// blendLexicon mixes the lexicon's reading into the model's probabilities
// for short texts, where the hashed features have little to go on and a
// few training sentences decide ("good app", "بد نیست", "so annoying"): the
// mix weight is lexiconShare·3/(3+words), a fifth at 6 words, and it fades
// with length.
func blendLexicon(p [sentClasses]float64, l lexiconScore) [sentClasses]float64 {
	a := lexiconShare * 3 / float64(3+l.words)
	var q [sentClasses]float64
	switch c := l.compound(); {
	case c >= 0.05:
		q = [sentClasses]float64{0.05, 0.4 - 0.4*c, 0.55 + 0.4*c}
	case c <= -0.05:
		q = [sentClasses]float64{0.55 - 0.4*c, 0.4 + 0.4*c, 0.05}
	default:
		q = [sentClasses]float64{0.1, 0.8, 0.1}
	}
	for c := range p {
		p[c] = (1-a)*p[c] + a*q[c]
	}
	return p
}

const lexiconShare = 0.6

// textFeatures fills sc with the tokens and features of text in lang, the
// model's whole reading of it, and returns its lexicon score; the trainer
// learns from exactly this.
func (m *sentimentModel) textFeatures(sc *sentScratch, text, lang string) lexiconScore {
	sc.norm = normalizeSentimentText(sc.norm[:0], text)
	tokenizeSentiment(sc)
	l := m.scoreLexicon(sc, markSentimentTokens(sc))
	m.extractFeatures(sc, lang, l)
	return l
}

func hasSentimentWords(sc *sentScratch) bool {
	for _, t := range sc.toks {
		if t.kind != tokBreak {
			return true
		}
	}
	return false
}

func softmax3(z [sentClasses]float32) [sentClasses]float64 {
	hi := max(z[0], z[1], z[2])
	var p [sentClasses]float64
	sum := 0.0
	for c := range z {
		p[c] = math.Exp(float64(z[c] - hi))
		sum += p[c]
	}
	for c := range p {
		p[c] /= sum
	}
	return p
}

// detectSentimentLang decides by script: more Persian/Arabic letters than
// Latin ones is "fa", else more Latin letters than letters of other scripts
// is "en" (Finglish too), else "other" (Korean, Cyrillic, emoji alone…).
func detectSentimentLang(text string) string {
	var fa, latin, other int
	for _, r := range text {
		switch {
		case r < 0x80:
			if (r|0x20) >= 'a' && (r|0x20) <= 'z' {
				latin++
			}
		case isArabicScript(r):
			if unicode.IsLetter(r) {
				fa++
			}
		case unicode.In(r, unicode.Latin):
			latin++
		case unicode.IsLetter(r):
			other++
		}
	}
	switch {
	case fa > 0 && fa >= latin && fa >= other:
		return "fa"
	case latin > 0 && latin >= other:
		return "en"
	}
	return "other"
}

// starEvidence is how likely each class is for an app review with a given
// star rating (docs/sentiment.md §4), NEGATIVE, NEUTRAL, POSITIVE.
var starEvidence = [6][sentClasses]float64{
	{1, 1, 1}, // no rating: no evidence
	{0.90, 0.07, 0.03},
	{0.75, 0.19, 0.06},
	{0.30, 0.50, 0.20},
	{0.07, 0.18, 0.75},
	{0.04, 0.08, 0.88},
}

// clearText is the probability from which a negative text overrules
// neutral or positive stars.
const clearText = 0.6

// fuseSentiment is the stored label (docs/sentiment.md §4). Without a
// rating the text decides alone, and for "other" text (p all NEUTRAL) the
// stars alone. With both: a clearly negative text (p ≥ clearText) under 3
// stars or more keeps its own probabilities, so "5★, crashes since the
// update, fix it" is NEGATIVE (reviewers rate high to be seen; the opposite,
// praise under 1★, is mostly sarcasm, so it gets no such say); else the
// square roots of the text's probabilities (a text that says little is weak
// evidence) are multiplied by the star evidence and renormalised.
func fuseSentiment(p [sentClasses]float64, stars int, lang string) sentimentResult {
	if stars < 0 || stars > 5 {
		stars = 0
	}
	ev := starEvidence[stars]
	switch text := argmax3(p); {
	case stars == 0:
	case lang == "other":
		p = ev
	case text == classNegative && p[text] >= clearText && stars >= 3:
	default:
		sum := 0.0
		for c := range p {
			p[c] = math.Sqrt(p[c]) * ev[c]
			sum += p[c]
		}
		for c := range p {
			p[c] /= sum
		}
	}
	return sentimentResult{
		Label:     sentimentLabels[argmax3(p)],
		Lang:      lang,
		PPositive: p[classPositive],
		PNeutral:  p[classNeutral],
		PNegative: p[classNegative],
	}
}

// argmax3 is the most probable class, NEUTRAL on a tie.
func argmax3(p [sentClasses]float64) int {
	best := classNeutral
	for c := range p {
		if p[c] > p[best] {
			best = c
		}
	}
	return best
}
