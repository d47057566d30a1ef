package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// maxStorefronts bounds an app's storefronts (app_storefronts.position is
// 0..19): every storefront is a crawl job per cycle.
const maxStorefronts = 20

// assignedCountries are the ISO 3166-1 alpha-2 codes officially assigned
// (249, as Debian's iso-codes lists them), in lower case as the Play Store's
// gl takes them, sorted. A code that merely looks right ("xx", "uk") is
// refused: the store would answer it with some default storefront, and the
// app would be watched in a country it is not. api/openapi.json lists the
// same codes (a test compares them).
var assignedCountries = strings.Fields(`
ad ae af ag ai al am ao aq ar as at au aw ax az ba bb bd be bf bg bh bi bj
bl bm bn bo bq br bs bt bv bw by bz ca cc cd cf cg ch ci ck cl cm cn co cr
cu cv cw cx cy cz de dj dk dm do dz ec ee eg eh er es et fi fj fk fm fo fr
ga gb gd ge gf gg gh gi gl gm gn gp gq gr gs gt gu gw gy hk hm hn hr ht hu
id ie il im in io iq ir is it je jm jo jp ke kg kh ki km kn kp kr kw ky kz
la lb lc li lk lr ls lt lu lv ly ma mc md me mf mg mh mk ml mm mn mo mp mq
mr ms mt mu mv mw mx my mz na nc ne nf ng ni nl no np nr nu nz om pa pe pf
pg ph pk pl pm pn pr ps pt pw py qa re ro rs ru rw sa sb sc sd se sg sh si
sj sk sl sm sn so sr ss st sv sx sy sz tc td tf tg th tj tk tl tm tn to tr
tt tv tw tz ua ug um us uy uz va vc ve vg vi vn vu wf ws ye yt za zm zw`)

// langPattern is a Play Store hl: an ISO 639 code (2 or 3 lower-case
// letters) with an optional region (2 upper-case letters, or 3 digits as
// in es-419).
var langPattern = regexp.MustCompile(`^[a-z]{2,3}(-([A-Z]{2}|[0-9]{3}))?$`)

// validateCountry says what is wrong with a storefront country; field
// names it in the message.
func validateCountry(field, c string) error {
	switch {
	case len(c) == 2 && strings.ToLower(c) != c && isAssignedCountry(strings.ToLower(c)):
		return fmt.Errorf("%s must be in lower case: %q, not %q", field, strings.ToLower(c), c)
	case len(c) != 2 || strings.Trim(c, "abcdefghijklmnopqrstuvwxyz") != "":
		return fmt.Errorf("%s must be an ISO 3166-1 alpha-2 country code in lower case such as \"us\" or \"ir\", not %q", field, truncate(c, 32))
	case !isAssignedCountry(c):
		return fmt.Errorf("%s %q is not an assigned ISO 3166-1 alpha-2 country code", field, c)
	}
	return nil
}

// validateCountryFilter is validateCountry without the list of assigned
// codes, for the filters of the reviews API and the exports: a code no app
// can have is a filter that matches nothing, not an error.
func validateCountryFilter(field, c string) error {
	if len(c) == 2 && strings.Trim(c, "abcdefghijklmnopqrstuvwxyz") == "" {
		return nil
	}
	return validateCountry(field, c)
}

func isAssignedCountry(c string) bool {
	_, found := slices.BinarySearch(assignedCountries, c)
	return found
}

// validateLang says what is wrong with a storefront language.
func validateLang(field, l string) error {
	if !langPattern.MatchString(l) {
		return fmt.Errorf("%s must be a language code such as \"en\", \"fa\" or \"pt-BR\" (ISO 639: 2 or 3 lower-case letters, optionally - and a region of 2 upper-case letters or 3 digits), not %q", field, truncate(l, 32))
	}
	return nil
}

// parseStorefronts reads the storefronts member of a POST or PATCH body
// (not null): 1 to maxStorefronts {"country", "lang"} objects, no two the
// same. A refusal names the member, e.g. storefronts[1].country.
func parseStorefronts(v json.RawMessage) ([]locale, error) {
	const want = `a list of {"country": "...", "lang": "..."} objects`
	var items []json.RawMessage
	if err := json.Unmarshal(v, &items); err != nil || items == nil {
		return nil, fmt.Errorf("storefronts has the wrong type: want %s", want)
	}
	if len(items) < 1 || len(items) > maxStorefronts {
		return nil, fmt.Errorf("storefronts must hold 1 to %d storefronts, not %d (null: the app's default storefront)", maxStorefronts, len(items))
	}
	out := make([]locale, 0, len(items))
	for i, item := range items {
		loc, err := parseStorefront(fmt.Sprintf("storefronts[%d]", i), item)
		if err != nil {
			return nil, err
		}
		if j := slices.Index(out, loc); j >= 0 {
			return nil, fmt.Errorf("storefronts[%d] repeats storefronts[%d] (country %q, lang %q)", i, j, loc.Country, loc.Lang)
		}
		out = append(out, loc)
	}
	return out, nil
}

func parseStorefront(field string, v json.RawMessage) (locale, error) {
	members, err := objectMembers(v)
	var memberErr *jsonMemberError
	switch {
	case errors.As(err, &memberErr):
		return locale{}, fmt.Errorf("%s.%w", field, err)
	case err != nil:
		return locale{}, fmt.Errorf(`%s must be an object {"country": "...", "lang": "..."}`, field)
	}
	for _, name := range slices.Sorted(maps.Keys(members)) {
		if name != "country" && name != "lang" {
			return locale{}, fmt.Errorf("%s.%s is an unknown field (known: country, lang)", field, truncate(name, 32))
		}
	}
	str := func(name string, validate func(field, v string) error) (string, error) {
		raw, ok := members[name]
		if !ok {
			return "", fmt.Errorf("%s.%s is required", field, name)
		}
		var s *string
		if json.Unmarshal(raw, &s) != nil || s == nil {
			return "", fmt.Errorf("%s.%s must be a string", field, name)
		}
		return *s, validate(field+"."+name, *s)
	}
	var loc locale
	if loc.Country, err = str("country", validateCountry); err != nil {
		return locale{}, err
	}
	if loc.Lang, err = str("lang", validateLang); err != nil {
		return locale{}, err
	}
	return loc, nil
}

// resolved is the app as the registry API shows it: its storefronts are the
// registered ones, else its default one, so that clients that never
// registered storefronts see where the app is read.
func (api *registryAPI) resolved(a app) app {
	a.Storefronts = api.locales.storefronts(a)
	return a
}

// appWithLastCrawl is GET /api/v1/apps/{package_name}: the app with why
// each storefront's last crawl went as it did. last_crawl is the first
// storefront's, as it was when an app had one storefront.
type appWithLastCrawl struct {
	app
	Storefronts []storefrontWithLastCrawl `json:"storefronts"` // shadows app.Storefronts
	LastCrawl   lastCrawl                 `json:"last_crawl"`
}

type storefrontWithLastCrawl struct {
	locale
	LastCrawl lastCrawl `json:"last_crawl"`
}

// withLastCrawls reads the last crawl of each of the app's storefronts (at
// most maxStorefronts reads of app_crawl_outcomes' primary key).
func (api *registryAPI) withLastCrawls(ctx context.Context, a app) (appWithLastCrawl, error) {
	a = api.resolved(a)
	out := appWithLastCrawl{app: a, Storefronts: make([]storefrontWithLastCrawl, len(a.Storefronts))}
	for i, loc := range a.Storefronts {
		lc, err := api.store.LastCrawl(ctx, a.ID, loc)
		if err != nil {
			return appWithLastCrawl{}, err
		}
		out.Storefronts[i] = storefrontWithLastCrawl{loc, lc}
	}
	out.LastCrawl = out.Storefronts[0].LastCrawl
	return out, nil
}
