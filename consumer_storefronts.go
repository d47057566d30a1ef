package main

// The storefront of the app-stats and reviews messages: the country and
// language the listing or review was read in (docs/design.md "Message
// contracts").

// storefront checks a message's country and lang: both given, each a code
// as crawl-jobs carry them, or neither (a message of an older playwatch,
// stored in its app's first storefront).
func (c *checks) storefront(country, lang string) {
	if country == "" && lang == "" {
		return
	}
	for _, f := range []struct{ name, v, other string }{{"country", country, "lang"}, {"lang", lang, "country"}} {
		if f.v == "" {
			c.fail(reasonMissing, "%s is required with %s", f.name, f.other)
		} else if err := parseLocaleCode(f.v); err != nil {
			c.fail(reasonBadValue, "%s %q: %v", f.name, truncateForReason(f.v), err)
		}
	}
}
