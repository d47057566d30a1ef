package main

import (
	"unicode"
	"unicode/utf8"
)

// Text preparation for the sentiment classifier (docs/sentiment.md §2): one
// normalisation for Persian and English, tokens, and the negation, contrast
// and intensity marks the lexicon score and the features read.

// sentToken is one token of a normalised text; its bytes are
// sentScratch.tb[s:e].
type sentToken struct {
	s, e    int32
	kind    sentTokKind
	punct   byte // a break's ASCII punctuation
	negated bool
	post    bool    // after the first contrast word
	weight  float32 // contrast × intensity, 1 when neither applies
}

type sentTokKind uint8

const (
	tokWord sentTokKind = iota
	tokEmoji
	tokBreak // . , ; : ! ? and the Persian ، ؛ ؟: ends a negation scope
)

// sentScratch holds the buffers of one classification, reused through the
// model's pool so that Classify does not allocate per call.
type sentScratch struct {
	norm  []byte
	tb    []byte
	toks  []sentToken
	feats []sentFeature
	key   []byte
}

// foldSentimentRune maps a rune to its normal form: Arabic letters to their
// Persian twins, Persian and Arabic digits to ASCII, upper case to lower; -1
// drops it (diacritics, tatweel, ZWNJ and the other joiners, variation
// selectors and skin tones, so "می‌شه" and "میشه" and "👍🏽" and "👍" are one).
func foldSentimentRune(r rune) rune {
	switch {
	case r < 0x80:
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	case r == 'ي' || r == 'ى' || r == 'ې':
		return 'ی'
	case r == 'ك':
		return 'ک'
	case r == 'ة' || r == 'ۀ':
		return 'ه'
	case r == 'أ' || r == 'إ' || r == 'ٱ':
		return 'ا'
	case r == 'ؤ':
		return 'و'
	case r >= 0x064B && r <= 0x065F, r == 0x0670, r == 0x0640:
		return -1 // harakat, superscript alef, tatweel
	case r >= 0x06F0 && r <= 0x06F9:
		return '0' + r - 0x06F0
	case r >= 0x0660 && r <= 0x0669:
		return '0' + r - 0x0660
	case r == '،':
		return ','
	case r == '؛':
		return ';'
	case r == '؟':
		return '?'
	case r == '’' || r == '‘' || r == 'ʼ':
		return '\''
	case r >= 0x200B && r <= 0x200F, r >= 0x202A && r <= 0x202E, r == 0xFEFF,
		r == 0xFE0E, r == 0xFE0F, r >= 0x1F3FB && r <= 0x1F3FF:
		return -1
	case r == 0x00A0 || r == 0x2028 || r == 0x2029:
		return ' '
	case unicode.IsUpper(r):
		return unicode.ToLower(r)
	}
	return r
}

func isArabicScript(r rune) bool {
	return (r >= 0x0600 && r <= 0x06FF) || (r >= 0xFB50 && r <= 0xFDFF) || (r >= 0xFE70 && r <= 0xFEFC) || (r >= 0x0750 && r <= 0x077F)
}

func isSentimentEmoji(r rune) bool {
	return (r >= 0x1F000 && r <= 0x1FAFF) || (r >= 0x2600 && r <= 0x27BF) || (r >= 0x2B00 && r <= 0x2BFF) || r == 0x3030 || r == 0x303D
}

// normalizeSentimentText appends the normal form of s to dst. Letters
// stretched for emphasis are collapsed: a Persian letter repeated three
// times or more becomes one (عاااالی → عالی, while the legitimate double of
// ببین stays), a Latin one becomes two (goooood → good). Invalid UTF-8
// becomes a space.
func normalizeSentimentText(dst []byte, s string) []byte {
	var last rune = -1
	run := 0
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		if r == utf8.RuneError && n == 1 {
			r = ' '
		}
		if r = foldSentimentRune(r); r < 0 {
			continue
		}
		if r == last && unicode.IsLetter(r) {
			run++
			switch {
			case run == 3 && isArabicScript(r):
				dst = dst[:len(dst)-utf8.RuneLen(r)] // back to a single copy
				continue
			case run >= 3:
				continue
			}
		} else {
			last, run = r, 1
		}
		dst = utf8.AppendRune(dst, r)
	}
	return dst
}

// Persian verb prefixes and plural/comparative suffixes written as separate
// words are joined to their word, so "نمی شه" = "نمی‌شه" = "نمیشه".
var (
	faJoinNext = map[string]bool{"می": true, "نمی": true}
	faJoinPrev = map[string]bool{"ها": true, "های": true, "هایی": true, "هاش": true, "تر": true, "ترین": true}
)

// tokenizeSentiment splits a normalised text into words, emoji and breaks.
// Apostrophes inside a word are dropped ("don't" → "dont").
func tokenizeSentiment(sc *sentScratch) {
	sc.tb, sc.toks = sc.tb[:0], sc.toks[:0]
	norm := sc.norm
	start := int32(-1)
	endWord := func() {
		if start >= 0 {
			sc.toks = append(sc.toks, sentToken{s: start, e: int32(len(sc.tb)), kind: tokWord, weight: 1})
			start = -1
		}
	}
	for i := 0; i < len(norm); {
		r, n := utf8.DecodeRune(norm[i:])
		i += n
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			if start < 0 {
				start = int32(len(sc.tb))
			}
			sc.tb = utf8.AppendRune(sc.tb, r)
		case r == '\'' && start >= 0:
		case isSentimentEmoji(r):
			endWord()
			s := int32(len(sc.tb))
			sc.tb = utf8.AppendRune(sc.tb, r)
			sc.toks = append(sc.toks, sentToken{s: s, e: int32(len(sc.tb)), kind: tokEmoji, weight: 1})
		case r == '.' || r == ',' || r == ';' || r == ':' || r == '!' || r == '?':
			endWord()
			sc.toks = append(sc.toks, sentToken{s: int32(len(sc.tb)), e: int32(len(sc.tb)), kind: tokBreak, punct: byte(r), weight: 1})
		default:
			endWord()
		}
	}
	endWord()
	joinPersianAffixes(sc)
}

func joinPersianAffixes(sc *sentScratch) {
	out := sc.toks[:0]
	for i := 0; i < len(sc.toks); i++ {
		t := sc.toks[i]
		w := sc.tb[t.s:t.e] // indexed as string(w): the compiler then allocates nothing
		switch {
		case t.kind == tokWord && faJoinNext[string(w)] && i+1 < len(sc.toks) && sc.toks[i+1].kind == tokWord && sc.toks[i+1].s == t.e:
			t.e = sc.toks[i+1].e // tokens are adjacent in tb: joining is widening
			i++
		case t.kind == tokWord && faJoinPrev[string(w)] && len(out) > 0 && out[len(out)-1].kind == tokWord && out[len(out)-1].e == t.s:
			out[len(out)-1].e = t.e
			continue
		}
		out = append(out, t)
	}
	sc.toks = out
}

// Word roles for marking (docs/sentiment.md §2).
const (
	roleNegFwd    = 1 << iota // negates the next words: not, never, هیچ, بدون
	roleNegBack               // negates the words before it: نیست, نشد, نداره
	roleContrast              // but, ولی, اما: what follows weighs more
	roleIntensify             // very, خیلی
	roleDampen                // a bit, یکم
	roleNegBare               // اصلا: negates the next words when no other negator follows in its clause
	roleResolve               // حل, fixed: a backward negation that reaches further (resolveScope)
)

var sentimentRoles = func() map[string]uint8 {
	m := map[string]uint8{}
	add := func(role uint8, words ...string) {
		for _, w := range words {
			m[w] |= role
		}
	}
	add(roleNegFwd, "not", "no", "never", "none", "nothing", "nobody", "neither", "nor", "without", "cannot", "cant",
		"dont", "doesnt", "didnt", "isnt", "wasnt", "wont", "wouldnt", "shouldnt", "couldnt", "arent", "werent",
		"hasnt", "havent", "hadnt", "aint", "nope",
		"نه", "هیچ", "بدون", "هیچی", "na", "hich", "bedoone", "bedune", "bedun")
	add(roleNegBack, "نیست", "نیستش", "نیستن", "نیستند", "نبود", "نبودش", "نشد", "نشده", "نمیشه", "نمیشود",
		"نداره", "ندارد", "نداشت", "نداشتم", "ندارم", "نکرد", "نکرده", "نکنید", "نباشه", "نمیارزه", "نمیکنه", "نمیکند",
		"nist", "nabood", "nabud", "nashod", "nadare", "nemishe")
	add(roleNegBack, "نیس", "نیستم", "نبودن", "نبودند", "نشدم", "نشدن", "نکن", "نکنین", "نکردم", "نکردن", "نخرید",
		"نخرین", "نزنید", "نزنین", "نداشته", "ندارن", "ندیدم", "نمیدم", "نخورده", "نرفت", "نیومد", "نمیاد", "نیامد",
		"nemikone", "nemiad", "nakonid", "nadaran", "nis", "nistam", "nakarde", "nakard", "nashode", "nadaram", "nemitoonam")
	add(roleNegBare, "اصلا", "اصلن", "aslan", "asan")
	// A fix undoes the complaint before it: "مشکل ورود حل شد", "login problem solved".
	add(roleNegBack|roleResolve, "حل", "رفع", "solved", "fixed", "resolved")
	add(roleContrast, "but", "however", "ولی", "اما", "ولیکن", "لیکن", "منتها", "vali", "amma", "ama")
	add(roleIntensify, "very", "really", "so", "extremely", "super", "too", "absolutely", "totally", "completely",
		"highly", "incredibly", "truly", "most", "soo", "realy",
		"خیلی", "خیلیی", "بسیار", "واقعا", "کاملا", "شدیدا", "انقدر", "اینقدر", "بینهایت", "اصلا", "بشدت", "حسابی",
		"اصلن", "asan", "aslan",
		"kheili", "kheyli", "khili", "vaghean", "vaghan", "kheiliii")
	add(roleDampen, "slightly", "somewhat", "kinda", "kindof", "bit", "little", "fairly", "barely",
		"یکم", "کمی", "یکمی", "نسبتا", "تقریبا", "ykm", "yekam")
	return m
}()

// sentimentRole is a word's role: the table's, and for any other Persian
// verb negated by its prefix (نمی‌پسندم, نمی‌خوره, نمی‌ارزه) a backward
// negation, so that "نمی‌" works with every verb, not only the listed ones.
func sentimentRole(w []byte) uint8 {
	if r, ok := sentimentRoles[string(w)]; ok {
		return r
	}
	if len(w) > len(faNegVerbPrefix)+2 && string(w[:len(faNegVerbPrefix)]) == faNegVerbPrefix {
		return roleNegBack
	}
	return 0
}

const faNegVerbPrefix = "نمی"

// negTransparent words are neither negated nor counted in a negation's
// reach: in "not bad at all" the negation is of "bad", and "at all" is
// emphasis, not a negated thing.
var negTransparent = map[string]bool{
	"a": true, "an": true, "the": true, "at": true, "all": true, "it": true, "its": true, "this": true,
	"that": true, "is": true, "be": true, "been": true, "to": true, "of": true, "for": true, "me": true,
	"هم": true, "که": true, "رو": true, "را": true, "این": true, "اون": true, "آن": true, "ام": true,
}

// negationScope is how many words a negation reaches.
const (
	negFwdScope  = 3
	negBackScope = 2
	resolveScope = 4
)

// markSentimentTokens sets each token's negation and weight: a word is
// negated at most once (هیچ مشکلی نداره is one negation of مشکل, not two);
// before the first contrast word a word weighs 0.5, after it 1.5 (as
// VADER does with "but"); an intensifier multiplies the next word by 1.3, a
// dampener by 0.7. Scopes end at punctuation.
func markSentimentTokens(sc *sentScratch) (negations int) {
	toks := sc.toks
	contrast := -1
	fwd := 0
	for i := range toks {
		t := &toks[i]
		if t.kind == tokBreak {
			fwd = 0
			continue
		}
		role := sentimentRole(sc.tb[t.s:t.e])
		transparent := negTransparent[string(sc.tb[t.s:t.e])]
		if fwd > 0 && role&(roleNegFwd|roleContrast) == 0 && !transparent {
			t.negated = true
			fwd--
		}
		if role&roleNegBare != 0 && !negatorFollows(sc, i) {
			role |= roleNegFwd // اصلا خوب: "not good at all", without the verb
		}
		if role&roleNegFwd != 0 {
			fwd = negFwdScope
			negations++
		}
		if role&roleNegBack != 0 {
			negations++
			scope := negBackScope
			if role&roleResolve != 0 {
				scope = resolveScope
			}
			for j, k := i-1, 0; j >= 0 && k < scope && toks[j].kind != tokBreak; j-- {
				w := sc.tb[toks[j].s:toks[j].e]
				if negTransparent[string(w)] {
					continue
				}
				if sentimentRole(w)&(roleNegFwd|roleNegBack) == 0 {
					toks[j].negated = true // not the هیچ of هیچ مشکلی نداره
				}
				k++
			}
		}
		if role&roleContrast != 0 {
			fwd = 0
			if contrast < 0 {
				contrast = i
			}
		}
		if i+1 < len(toks) && toks[i+1].kind != tokBreak {
			switch {
			case role&roleIntensify != 0:
				toks[i+1].weight *= 1.3
			case role&roleDampen != 0:
				toks[i+1].weight *= 0.7
			}
		}
	}
	if contrast >= 0 {
		for i := range toks {
			if i < contrast {
				toks[i].weight *= 0.5
			} else if i > contrast {
				toks[i].weight *= 1.5
				toks[i].post = true
			}
		}
	}
	return negations
}

// negatorFollows tells whether a negator comes after token i in its clause.
func negatorFollows(sc *sentScratch, i int) bool {
	for j := i + 1; j < len(sc.toks) && sc.toks[j].kind != tokBreak; j++ {
		if sentimentRole(sc.tb[sc.toks[j].s:sc.toks[j].e])&(roleNegFwd|roleNegBack) != 0 {
			return true
		}
	}
	return false
}
