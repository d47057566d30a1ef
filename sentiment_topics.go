package main

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// The topic classifier (docs/sentiment.md §8): what a review is about, for
// reviews.topics. Multi-label, Persian, English and Finglish, on the text
// the sentiment classifier normalises and tokenises (sentiment_text.go), by
// word and phrase patterns: precision first, a review that names no
// pattern has no topic.

// reviewTopics are the topics in the order the classifier returns them.
var reviewTopics = []string{"crash", "performance", "ads", "login", "payment", "update", "network",
	"ui", "notifications", "battery", "privacy", "support", "feature_request"}

// A pattern is words separated by spaces, matched against consecutive
// tokens of one clause (no punctuation between). A word ending in * matches
// any token it begins (تبلیغ* is تبلیغات, تبلیغاتش…: the Persian suffixes;
// crash* is crashes, crashing); "a|b" matches either; "…" lets up to four
// tokens pass before the next word. A pattern starting with ! is a
// mention that a negation cancels: "no ads", "never crashes", "بدون تبلیغ",
// "تبلیغ نداره", "کرش نمیکنه" are not complaints about ads or crashes. A
// word starting with - is one that must not come right before (first) or
// right after (last) the pattern's words: "social network", "رمز ارز".
var topicPatterns = map[string][]string{
	"crash": {
		"!crash*", "!freez*", "!froze*", "!frozen", "keeps closing", "keeps stopping", "keeps shutting", "force close*", "force stop*",
		"closes itself", "closes by itself", "shuts down", "closing itself", "kicks me out", "kicks you out",
		"wont open", "won't open", "doesnt open", "does not open", "not opening", "cant open", "cannot open", "not even open*",
		"black screen", "white screen", "blank screen", "has stopped", "keeps stopping", "not responding", "stuck on the splash",
		"!کرش*", "!هنگ*", "!کرشی", "بسته میشه|میشه", "بسته میشود", "خودش بسته*", "خود به خود بسته*", "باز نمیشه|نمیشود|نمیشد|نشد",
		"اجرا نمیشه|نمیشود|نشد", "از برنامه میپره", "میپره بیرون", "میپرم بیرون", "پرت میکنه|میشم|میشه بیرون", "پرتم میکنه",
		"صفحه سیاه", "صفحه سفید", "قفل میکنه|میشه|کرد", "ارور میده|داد|میدهد", "خطا میده|میدهد", "از کار افتاده",
		"!crash*", "hang mikone", "hang mikoneh", "baz nemishe", "baste mishe", "!kerash*",
	},
	"performance": {
		"!slow*", "!lag*", "!laggy", "sluggish", "takes forever", "loading forever", "forever to load", "takes ages", "too long to load",
		"long time to load", "seconds to open|load|start", "minutes to open|load|start", "loads fast", "loads quickly", "opens fast", "opens quickly",
		"super fast", "lightning fast", "!performance", "!stutter*", "heavy app", "so heavy", "too heavy", "very heavy", "!choppy", "fps drop*", "frame drop*",
		"!لگ*", "!کنده", "!کندی", "کند شده", "کند شد", "خیلی کند", "کند و", "کند است", "کند هست", "کنده", "سرعتش پایین*", "سرعت پایین*", "سرعتش کم*", "سرعت کم*",
		"سرعتش خیلی کم*", "سرعت برنامه", "سرعت اجرا", "سنگینه", "سنگین شده", "خیلی سنگین*", "برنامه سنگین*", "دیر باز", "دیر لود*", "لودش طول",
		"طول میکشه|میکشد", "دیر میاد بالا", "کش میده", "!lag", "kond*", "sangine", "sorat*",
	},
	"ads": {
		"!ads", "!ad", "!advert", "!adverts", "!advertisement*", "!advertising", "!commercial*", "too many adds", "so many adds", "full of adds", "adds every", "!popup ads", "pop up ads",
		"!تبلیغ*", "!تبلیغات*", "!tabligh*", "!adware",
	},
	"login": {
		"login*", "log in", "logging in", "logged out", "logging me out", "logs me out", "log me out", "sign in", "signing in", "signin",
		"sign up", "signup", "registration", "password*", "otp", "verification code", "verification sms", "verify my", "two factor", "2fa",
		"authenticat*", "the account", "account is locked", "locked out", "account got", "cant log", "lost access",
		"لاگین*", "ورود", "وارد نمیشه|نمیشم|نمیشود|نشد|نمیتونم|شم|بشم", "نمیتونم وارد", "ثبت نام*", "ثبتنام*", "رمز* -ارز*", "پسورد*", "کد تایید*",
		"کد فعالسازی", "کد فعال سازی", "کد ورود", "کد پیامک*", "احراز هویت", "احراز*", "اکانت*", "حساب کاربری*",
		"یوزر*", "نام کاربری", "حسابم|حساب مسدود*", "خارج میکنه|میشه|شدم", "لاگ اوت", "vorood", "sabtenam", "sabt nam", "ramz*", "login",
	},
	"payment": {
		"payment*", "pay", "paid", "paying", "purchase*", "purchasing", "subscription*", "refund*", "charged me", "charged twice", "overcharg*",
		"billing", "billed", "my money", "money back", "credit card", "debit card", "transaction*", "price*", "pricing", "expensive", "overpriced",
		"premium version", "pay for", "in app purchase*", "took money", "took my money", "money from",
		"پرداخت*", "درگاه*", "اشتراک*", "کیف پول*", "پولم*", "پول", "پولمو", "پولی", "تومن", "تومان", "هزینه*", "گرون*", "گران*", "قیمت*", "بازگشت وجه",
		"کسر شد", "کسر شده", "تراکنش*", "کارت بانکی", "حساب بانکی", "خرید درون*", "خرید داخل*", "خرید اشتراک", "شارژ حساب", "pardakht*", "poolam*", "pool az", "pool kam", "pool pardakht", "gheymat*", "geroon*", "gerun*", "eshterak*",
	},
	"update": {
		"update*", "updating", "upgrade*", "new version", "latest version", "last version", "previous version", "old version", "this version", "version update",
		"آپدیت*", "اپدیت*", "بروزرسانی*", "بروز رسانی*", "بهروزرسانی*", "به روز رسانی*", "بهروز رسانی*", "نسخه جدید*", "ورژن*", "نسخه قبل*",
		"آخرین نسخه*", "نسخه آخر*", "نسخه اخیر", "نسخه فعلی", "نسخه قدیم*", "apdeit*", "update*", "noskhe*",
	},
	"network": {
		"internet", "-social network*", "connection*", "connecting", "cant connect", "cannot connect", "unable to connect", "wont connect",
		"doesnt connect", "connect to the", "disconnect*", "buffering", "offline", "wifi", "wi fi", "vpn*", "mobile data",
		"proxy", "proxies", "filtered", "filtering", "no signal", "server error", "servers are down", "timeout", "timed out",
		"فیلتر*", "vpn*", "وی پی ان", "ویپیان", "نت", "نتم", "نتش", "نته", "نتمون", "اینترنت*", "قطع میشه|میشود|میکنه|شد|شده|است|هست", "قطعه", "قطع و وصل", "قطعی*",
		"وصل نمیشه|نمیشود|نشد|نمیشم|نمیشیم", "اتصال*", "شبکه* -اجتماعی*", "پروکسی*", "پروکسیها", "سرور*", "آیپی", "ای پی", "دیتا", "وای فای", "وایفای",
		"filter*", "filtershekan", "net", "netam", "ghat*", "internet*",
	},
	"ui": {
		"ui", "user interface", "interface", "design", "redesign*", "layout", "dark mode", "night mode", "dark theme", "theme", "themes", "font*",
		"button*", "menu*", "icon*", "ugly", "confusing", "cluttered", "navigation", "navigate", "colors", "colours", "color scheme", "text size",
		"looks bad", "looks outdated", "looks great", "looks nice", "ux",
		"رابط کاربری*", "ظاهر|ظاهرش|ظاهرشو|ظاهرشون", "طراحی*", "فونت*", "دکمه*", "منوی", "منوها*", "منو ها", "حالت شب", "حالت تاریک", "تم", "تمش", "تمها", "تم های|تاریک|روشن", "دارک مود", "آیکون*", "ایکون*",
		"رنگبندی*", "رنگ بندی*", "رنگها", "شلوغ*", "زشت*", "محیط برنامه*", "محیط کاربری*", "گرافیک*", "چیدمان*", "صفحه اصلی", "zaher*", "tarahi*", "font",
	},
	"notifications": {
		"notification*", "notif*", "push message*", "push alert*", "alerts", "reminder*",
		"نوتیف*", "اعلان*", "نوتیفیکیشن*", "ناتیفیکیشن*", "پیام نمیاد", "پیامها نمیاد", "پیام ها نمیاد", "notif*",
	},
	"battery": {
		"battery", "batteries", "drains", "draining", "drain my", "overheat*", "heats up", "gets hot", "phone hot", "power consumption",
		"باتری*", "باطری*", "شارژ گوشی*", "شارژمو", "شارژم", "شارژ میخوره|تموم|خالی", "شارژ رو", "داغ", "داغه", "داغ میکنه|میشه|کرد|شد|میکند|میشود", "گرم میشه|میکنه|میشود", "مصرف باتری", "batri*", "battery*", "sharjam", "sharj",
	},
	"privacy": {
		"privacy", "personal data", "your data", "third part*", "data to", "data collection", "collects data", "permission*", "spy*", "spying", "tracking", "tracker*",
		"access to my", "access to contacts", "my contacts", "my location", "sells data", "sell my", "sell your", "hacked", "security",
		"حریم*", "اطلاعات شخصی*", "اطلاعات کاربر*", "اطلاعاتمون", "اطلاعاتم", "دسترسی به مخاطب*|گالری|میکروفون|میکروفن|دوربین|لوکیشن|موقعیت|اطلاعات*|پیام*|تماس*|عکس*|همه*|فایل*", "دسترسی میخواد|میخواهد|میگیره|داره|داشته|خواست*|میده",
		"دسترسیها*", "دسترسی های", "اجازه دسترسی", "مجوز*", "جاسوس*", "امنیت*", "هک", "هک شد*", "هکر*",
		"ردیابی*", "لوکیشن*", "مخاطبین*", "harim*", "amniat*", "dastresi*",
	},
	"support": {
		"support team", "customer support", "customer service", "customer care", "contacted support", "contact support", "no support", "tech support",
		"the support", "support is", "support never", "contacted them", "emailed", "email them", "sent an email", "sent them", "no response", "no reply",
		"never respond*", "never replied", "never answer*", "didnt respond", "didnt reply", "dont respond", "dont reply", "respond to",
		"reply to", "nobody replied|answered|responded", "nobody ever replied|answered|responded", "help desk", "ticket*", "developers dont", "developer never", "devs dont",
		"پشتیبانی*", "پاسخگو*", "جواب نمیدن|نمیدید|ندادن|نمیدن", "جوابی ندادن|نداد|نگرفتم", "تیکت*", "تماس گرفتم", "زنگ زدم", "ایمیل زدم", "ایمیل دادم",
		"پیگیری کردم|نکردن|نمیکنن|نکردند|میکنیم|کنید", "کارشناس*", "poshtibani*", "javab nemidan",
	},
	"feature_request": {
		"please add", "pls add", "plz add", "plese add", "kindly add", "add a", "add an", "add option*", "add the option", "add support", "add dark",
		"would be nice", "would be great", "would be good", "would love", "i wish", "wish there", "wish it", "hope you add", "hope you will", "should add",
		"could you add", "can you add", "can you please", "could you please add", "feature request", "option to", "suggestion*", "i suggest", "needs an option",
		"please make", "please bring", "bring back", "missing feature*", "want a", "wanted a",
		"لطفا … اضافه*", "اضافه کنید", "اضافه کنین", "اضافه بشه", "اضافه کن", "اضافه کنید", "اضافه شه", "اضافه بکنید", "اضافه نمایید", "اضافه بفرمایید",
		"کاش", "ایکاش", "ای کاش", "پیشنهادم", "پیشنهاد من", "یه پیشنهاد", "یک پیشنهاد",
		"پیشنهاد میکنم|میدم|میدهم|میکنیم … امکان|قابلیت|گزینه|بخش|اضافه*|بذارید|بزارید", "بذارید", "بزارید", "بذارین", "بزارین", "قرار بدید", "قرار بدین", "قابلیت … اضافه*",
		"امکان … بذارید|بزارید|بدید|اضافه*", "قابل انتخاب|تنظیم|تغییر کنید|کنین|بشه", "میشه … اضافه*", "ezafe konid", "ezafe konin", "ezafe beshe", "kash", "lotfan … ezafe",
	},
}

// Negations that cancel a ! mention: before it (within two tokens of its
// clause) or, for Persian, right after it.
var (
	topicNegBefore = map[string]bool{"no": true, "never": true, "without": true, "zero": true, "not": true, "dont": true, "doesnt": true,
		"didnt": true, "isnt": true, "wasnt": true, "wont": true, "hasnt": true, "havent": true, "nor": true, "free": true, "any": true,
		"بدون": true, "هیچ": true, "بی": true, "نه": true, "bedoone": true, "bedune": true, "bedun": true, "hich": true}
	topicNegAfter = map[string]bool{"free": true, "نداره": true, "ندارد": true, "نداشت": true, "نداشتم": true, "نداره،": true, "نمیکنه": true,
		"نمیکند": true, "نکرد": true, "نکرده": true, "نمیده": true, "ندیدم": true, "نیست": true, "نمیاد": true, "nadare": true, "nemikone": true,
		"نداشته": true, "ندیده": true, "نخورده": true}
)

type topicWord struct {
	alts   []string // the token, or its beginning when prefix
	prefix []bool
	gap    bool // up to topicGap tokens may come before it
}

type topicPattern struct {
	topic            uint16 // bit of reviewTopics
	words            []topicWord
	notPrev, notNext *topicWord
	negatable        bool
}

const topicGap = 4

// topicClassifier is read-only once built, so safe for concurrent use.
type topicClassifier struct {
	// trie holds the patterns' first words by their bytes: one walk down a
	// token finds every pattern it can start (a token ending at a node is
	// an exact match, a node passed on the way a prefix match), without a
	// map lookup per possible prefix length.
	trie []topicNode
	pats []topicPattern
	pool sync.Pool // *sentScratch
}

type topicNode struct {
	next   []topicEdge
	exact  []int32 // patterns whose first word is this node's bytes
	prefix []int32 // patterns whose first word* begins so
}

type topicEdge struct {
	b    byte
	node int32
}

// child is node n's child by b, or -1.
func (c *topicClassifier) child(n int32, b byte) int32 {
	for _, e := range c.trie[n].next {
		if e.b == b {
			return e.node
		}
	}
	return -1
}

// insert adds key's path and returns its node.
func (c *topicClassifier) insert(key string) int32 {
	n := int32(0)
	for i := 0; i < len(key); i++ {
		m := c.child(n, key[i])
		if m < 0 {
			m = int32(len(c.trie))
			c.trie = append(c.trie, topicNode{})
			c.trie[n].next = append(c.trie[n].next, topicEdge{key[i], m})
		}
		n = m
	}
	return n
}

func newTopicClassifier() *topicClassifier {
	c := &topicClassifier{trie: []topicNode{{}}}
	c.pool.New = func() any { return &sentScratch{} }
	for bit, topic := range reviewTopics {
		for _, p := range topicPatterns[topic] {
			tp := topicPattern{topic: 1 << bit}
			if rest, ok := strings.CutPrefix(p, "!"); ok {
				p, tp.negatable = rest, true
			}
			gap := false
			for _, w := range strings.Fields(p) {
				if w == "…" {
					gap = true
					continue
				}
				not := strings.HasPrefix(w, "-")
				w = strings.TrimPrefix(w, "-")
				tw := topicWord{gap: gap}
				gap = false
				for _, a := range strings.Split(w, "|") {
					a, pre := strings.CutSuffix(a, "*")
					// The pattern goes through the text's normalisation, so
					// that it is written as people write (آ, ZWNJ, ي).
					a = string(normalizeSentimentText(nil, a))
					tw.alts = append(tw.alts, a)
					tw.prefix = append(tw.prefix, pre)
				}
				switch {
				case not && len(tp.words) == 0:
					tp.notPrev = &tw
				case not:
					tp.notNext = &tw
				default:
					tp.words = append(tp.words, tw)
				}
			}
			idx := int32(len(c.pats))
			c.pats = append(c.pats, tp)
			first := tp.words[0]
			for k, a := range first.alts {
				n := c.insert(a)
				if first.prefix[k] {
					c.trie[n].prefix = append(c.trie[n].prefix, idx)
				} else {
					c.trie[n].exact = append(c.trie[n].exact, idx)
				}
			}
		}
	}
	return c
}

// Classify returns the review's topics in reviewTopics' order; none is an
// empty, non-nil slice (stored as '{}', which the backfill tells from NULL).
func (c *topicClassifier) Classify(text string) []string {
	mask := c.classifyMask(text)
	out := make([]string, 0, 2)
	for bit, t := range reviewTopics {
		if mask&(1<<bit) != 0 {
			out = append(out, t)
		}
	}
	return out
}

func (c *topicClassifier) classifyMask(text string) uint16 {
	sc := c.pool.Get().(*sentScratch)
	defer c.pool.Put(sc)
	sc.norm = normalizeSentimentText(sc.norm[:0], text)
	tokenizeSentiment(sc)
	var mask uint16
	for i := range sc.toks {
		t := sc.toks[i]
		if t.kind != tokWord {
			continue
		}
		w := sc.tb[t.s:t.e]
		n := int32(0)
		for k := 0; k < len(w) && n >= 0; k++ {
			if n = c.child(n, w[k]); n < 0 {
				break
			}
			if k+1 < len(w) && !utf8.RuneStart(w[k+1]) {
				continue // inside a rune
			}
			for _, idx := range c.trie[n].prefix {
				mask |= c.match(sc, i, idx)
			}
			if k+1 == len(w) {
				for _, idx := range c.trie[n].exact {
					mask |= c.match(sc, i, idx)
				}
			}
		}
	}
	return mask
}

func (c *topicClassifier) tok(sc *sentScratch, i int) []byte {
	return sc.tb[sc.toks[i].s:sc.toks[i].e]
}

// match is pattern idx's topic bit when its words follow token i (whose
// first word matched), else 0.
func (c *topicClassifier) match(sc *sentScratch, i int, idx int32) uint16 {
	p := &c.pats[idx]
	end := i
	for _, w := range p.words[1:] {
		found := false
		limit := 1
		if w.gap {
			limit = topicGap + 1
		}
		for k := end + 1; k < len(sc.toks) && k <= end+limit; k++ {
			if sc.toks[k].kind == tokBreak {
				break
			}
			if sc.toks[k].kind == tokWord && w.matches(c.tok(sc, k)) {
				end, found = k, true
				break
			}
		}
		if !found {
			return 0
		}
	}
	if p.notPrev != nil && i > 0 && sc.toks[i-1].kind == tokWord && p.notPrev.matches(c.tok(sc, i-1)) ||
		p.notNext != nil && end+1 < len(sc.toks) && sc.toks[end+1].kind == tokWord && p.notNext.matches(c.tok(sc, end+1)) {
		return 0
	}
	if p.negatable && c.negated(sc, i, end) {
		return 0
	}
	return p.topic
}

func (w topicWord) matches(tok []byte) bool {
	for k, a := range w.alts {
		if w.prefix[k] {
			if len(tok) >= len(a) && string(tok[:len(a)]) == a {
				return true
			}
		} else if string(tok) == a {
			return true
		}
	}
	return false
}

// negated reports whether the mention toks[i..end] is cancelled: a negation
// within two tokens before it, or one right after it, in its clause.
func (c *topicClassifier) negated(sc *sentScratch, i, end int) bool {
	for k := i - 1; k >= 0 && k >= i-2; k-- {
		if sc.toks[k].kind == tokBreak {
			break
		}
		if topicNegBefore[string(c.tok(sc, k))] {
			return true
		}
	}
	for k := end + 1; k < len(sc.toks) && k <= end+2; k++ {
		if sc.toks[k].kind == tokBreak {
			break
		}
		if topicNegAfter[string(c.tok(sc, k))] {
			return true
		}
	}
	return false
}
