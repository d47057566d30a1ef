package main

import (
	"math"
	"unicode/utf8"
)

// The classifier's features (docs/sentiment.md §3): hashed word 1–2-grams and
// character 3–4-grams in sentBuckets buckets, then a few dense features from
// the lexicon score that every language shares, so that what the English
// training data teaches about a lexicon score carries over to Persian.

const sentBuckets = 1 << 16

// Dense features, numbered after the buckets.
const (
	dBiasFa = sentBuckets + iota
	dBiasEn
	dLexPos
	dLexNeg
	dCompound
	dCompoundFa
	dCompoundEn
	dNPos
	dNNeg
	dNegations
	dExclaim
	dQuestion
	dLength
	dNoLex           // no word of the lexicon: what neutral statements look like
	dNegatedPos      // the strength of negated praise ("not good")
	dNegatedNeg      // the strength of negated complaints ("not bad", "never crashes")
	dEmojiPos        // emoji valences, which read the same in every language
	dEmojiNeg        //
	dPostContrast    // the compound of the clause after the first "but"/"ولی", which dominates
	dCompoundBin0    // the compound in 7 bins: lets a linear model place neutral in the middle
	sentFeatureCount = dCompoundBin0 + compoundBinCount
)

// compoundBins are the upper bounds of the compound's bins but the last.
const compoundBinCount = 7

var compoundBins = [compoundBinCount - 1]float64{-0.6, -0.3, -0.05, 0.05, 0.3, 0.6}

// Hash kinds keep the feature families apart in the shared buckets.
const (
	hashWord    = 'w'
	hashNegWord = 'n'
	hashBigram  = 'b'
	hashChar    = 'c'
	hashNegChar = 'C' // a negated word's character n-grams: "not bad" must not read as "bad"
)

type sentFeature struct {
	idx uint32
	v   float32
}

// lexiconScore is the lexicon's reading of a text.
type lexiconScore struct {
	pos, neg   float64 // sums of positive and of (the magnitude of) negative valences, marks applied
	nPos, nNeg int
	negations  int
	negPos     float64 // magnitudes of negated positive and negative valences, before negation
	negNeg     float64
	emoPos     float64 // emoji's share of pos and neg
	emoNeg     float64
	post       float64 // the summed valence after the first contrast word
	exclaim    int
	question   int
	words      int
}

// compound squashes the summed valence into (-1, 1) as VADER does, the
// exclamation marks adding emphasis.
func (l lexiconScore) compound() float64 {
	s := l.pos - l.neg
	if s != 0 {
		s += math.Copysign(0.292*float64(min(l.exclaim, 4)), s)
	}
	return s / math.Sqrt(s*s+15)
}

// negationScalar is VADER's: a negated word keeps three quarters of its
// strength with the opposite sign. A negated complaint keeps less: "not
// bad" leans positive but is weaker praise than "good" (negatedNegScalar).
const (
	negationScalar   = -0.74
	negatedNegScalar = -0.5
)

// faSuffixes are stripped, longest first, from a Persian word the lexicon
// does not hold: plural, possessive and copula endings (خوبه → خوب,
// مشکلی → مشکل, تبلیغاتش → تبلیغات).
var faSuffixes = [][]byte{
	[]byte("هایی"), []byte("هاش"), []byte("های"), []byte("ها"), []byte("ترین"), []byte("تر"),
	[]byte("یه"), []byte("ست"), []byte("ه"), []byte("ی"), []byte("ش"), []byte("م"),
}

// valence looks a word up: the two-word entry it starts first (span 2), then
// the word, then for Persian the word without a suffix.
func (m *sentimentModel) valence(sc *sentScratch, i int) (v float32, span int) {
	t := sc.toks[i]
	w := sc.tb[t.s:t.e]
	if i+1 < len(sc.toks) && sc.toks[i+1].kind == tokWord && len(m.lex2) > 0 {
		n := sc.toks[i+1]
		sc.key = append(append(append(sc.key[:0], w...), ' '), sc.tb[n.s:n.e]...)
		if v, ok := m.lex2[string(sc.key)]; ok {
			return v, 2
		}
	}
	if v, ok := m.lex[string(w)]; ok {
		return v, 1
	}
	if r, _ := utf8.DecodeRune(w); !isArabicScript(r) {
		return 0, 1
	}
	for _, suf := range faSuffixes {
		if len(w) >= len(suf)+4 && string(w[len(w)-len(suf):]) == string(suf) {
			if v, ok := m.lex[string(w[:len(w)-len(suf)])]; ok {
				return v, 1
			}
		}
	}
	return 0, 1
}

// scoreLexicon reads the marked tokens with the lexicon.
func (m *sentimentModel) scoreLexicon(sc *sentScratch, negations int) lexiconScore {
	l := lexiconScore{negations: negations}
	for i := 0; i < len(sc.toks); i++ {
		t := sc.toks[i]
		switch t.kind {
		case tokBreak:
			switch t.punct {
			case '!':
				l.exclaim++
			case '?':
				l.question++
			}
			continue
		case tokWord:
			l.words++
		}
		v, span := m.valence(sc, i)
		if v == 0 {
			continue
		}
		x := float64(v * t.weight)
		// A two-word entry is negated only from outside: in "بدون تبلیغ"
		// or "باز نمیشه" the negation is part of the entry.
		if t.negated && (span == 1 || sc.toks[i+1].negated) {
			if x > 0 {
				l.negPos += x
				x *= negationScalar
			} else {
				l.negNeg -= x
				x *= negatedNegScalar
			}
		}
		if x > 0 {
			l.pos += x
			l.nPos++
		} else {
			l.neg -= x
			l.nNeg++
		}
		if t.post {
			l.post += x
		}
		if t.kind == tokEmoji {
			if x > 0 {
				l.emoPos += x
			} else {
				l.emoNeg -= x
			}
		}
		i += span - 1
	}
	return l
}

func sentHash(kind byte, b []byte) uint32 {
	h := uint32(2166136261)
	h = (h ^ uint32(kind)) * 16777619
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	return h
}

func sentHashMore(h uint32, b []byte) uint32 {
	h = (h ^ ' ') * 16777619
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	return h
}

func sentBucket(h uint32) uint32 { return h & (sentBuckets - 1) }

// maxCharGramRunes bounds the character n-grams of one (pathologically long) word.
const maxCharGramRunes = 24

// extractFeatures fills sc.feats for text already tokenised and marked.
// The hashed features form a binary vector scaled to unit length; lang is
// "fa" or "en".
func (m *sentimentModel) extractFeatures(sc *sentScratch, lang string, l lexiconScore) {
	f := sc.feats[:0]
	prev := -1
	for i, t := range sc.toks {
		if t.kind == tokBreak {
			prev = -1
			continue
		}
		w := sc.tb[t.s:t.e]
		kind := byte(hashWord)
		if t.negated {
			kind = hashNegWord
		}
		from := len(f)
		f = append(f, sentFeature{sentBucket(sentHash(kind, w)), 1})
		if prev >= 0 {
			p := sc.toks[prev]
			f = append(f, sentFeature{sentBucket(sentHashMore(sentHash(hashBigram, sc.tb[p.s:p.e]), w)), 1})
		}
		prev = i
		if t.kind == tokWord {
			f = appendCharGrams(f, sc, w, t.negated)
		}
		// The clause after "but"/"ولی" weighs more here too, as in the
		// lexicon score: "slow at first, but now it's great" is praise.
		for k := from; k < len(f); k++ {
			f[k].v = t.weight
		}
	}
	if len(f) > 0 {
		sum := 0.0
		for _, x := range f {
			sum += float64(x.v * x.v)
		}
		scale := float32(1 / math.Sqrt(sum))
		for i := range f {
			f[i].v *= scale
		}
	}
	c := l.compound()
	bias, cl := uint32(dBiasEn), uint32(dCompoundEn)
	if lang == "fa" {
		bias, cl = dBiasFa, dCompoundFa
	}
	f = append(f,
		sentFeature{bias, 1},
		sentFeature{dLexPos, float32(math.Log1p(l.pos))},
		sentFeature{dLexNeg, float32(math.Log1p(l.neg))},
		sentFeature{dCompound, float32(c)},
		sentFeature{cl, float32(c)},
		sentFeature{dNPos, float32(math.Log1p(float64(l.nPos)))},
		sentFeature{dNNeg, float32(math.Log1p(float64(l.nNeg)))},
		sentFeature{dNegations, float32(min(l.negations, 3)) / 3},
		sentFeature{dExclaim, float32(min(l.exclaim, 3)) / 3},
		sentFeature{dLength, float32(math.Log1p(float64(l.words)) / 4)},
	)
	if l.question > 0 {
		f = append(f, sentFeature{dQuestion, 1})
	}
	if l.nPos+l.nNeg == 0 {
		f = append(f, sentFeature{dNoLex, 1})
	}
	f = append(f,
		sentFeature{dNegatedPos, float32(math.Log1p(l.negPos))},
		sentFeature{dNegatedNeg, float32(math.Log1p(l.negNeg))},
		sentFeature{dEmojiPos, float32(math.Log1p(l.emoPos))},
		sentFeature{dEmojiNeg, float32(math.Log1p(l.emoNeg))},
		sentFeature{dPostContrast, float32(l.post / math.Sqrt(l.post*l.post+15))},
	)
	bin := len(compoundBins)
	for i, hi := range compoundBins {
		if c <= hi {
			bin = i
			break
		}
	}
	f = append(f, sentFeature{uint32(dCompoundBin0 + bin), 1})
	sc.feats = f
}

// appendCharGrams adds the character 3- and 4-grams of "^word$".
func appendCharGrams(f []sentFeature, sc *sentScratch, w []byte, negated bool) []sentFeature {
	kind := byte(hashChar)
	if negated {
		kind = hashNegChar
	}
	var offs [maxCharGramRunes + 3]int
	sc.key = append(append(append(sc.key[:0], '^'), w...), '$')
	n := 0
	for i := 0; i < len(sc.key) && n < len(offs)-1; {
		offs[n] = i
		n++
		_, size := utf8.DecodeRune(sc.key[i:])
		i += size
	}
	offs[n] = len(sc.key)
	for g := 3; g <= 4; g++ {
		for j := 0; j+g <= n; j++ {
			f = append(f, sentFeature{sentBucket(sentHash(kind, sc.key[offs[j]:offs[j+g]])), 1})
		}
	}
	return f
}
