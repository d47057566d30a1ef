package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
)

// The codes of a storefront as the registry takes them: an ISO 3166-1
// alpha-2 country in lower case (us, ir), and a language code (en, fa,
// pt-BR). The notifier's rule filters, the reviews API and the exports
// check them the same way, so that a typo is a 400 rather than a filter
// that never matches.
var (
	storefrontCountryRE = regexp.MustCompile(`^[a-z]{2}$`)
	storefrontLangRE    = regexp.MustCompile(`^[a-z]{2,3}(-[A-Z]{2}|-[0-9]{3})?$`)
)

// checkStorefrontCountry says what is wrong with country, as field.
func checkStorefrontCountry(field, country string) error {
	if !storefrontCountryRE.MatchString(country) {
		return fmt.Errorf("%s must be an ISO 3166-1 alpha-2 country code in lower case, such as us or ir", field)
	}
	return nil
}

// checkStorefrontLang says what is wrong with lang, as field.
func checkStorefrontLang(field, lang string) error {
	if !storefrontLangRE.MatchString(lang) {
		return fmt.Errorf("%s must be a language code such as en, fa or pt-BR", field)
	}
	return nil
}

// maxFilterStorefronts is as many as an app may have.
const maxFilterStorefronts = 20

// decodeStorefronts reads name, a list of {"country", "lang"} objects (an
// empty list: every storefront); a storefront given twice counts once.
func decodeStorefronts(name string, v json.RawMessage) ([]locale, error) {
	var raw []json.RawMessage
	if json.Unmarshal(v, &raw) != nil || string(v) == "null" {
		return nil, fmt.Errorf("%s must be a list of storefronts such as [{\"country\": \"us\", \"lang\": \"en\"}]", name)
	}
	if len(raw) > maxFilterStorefronts {
		return nil, fmt.Errorf("%s must list at most %d storefronts", name, maxFilterStorefronts)
	}
	var out []locale
	for i, r := range raw {
		item := fmt.Sprintf("%s[%d]", name, i)
		members, err := objectMembers(r)
		if err != nil {
			return nil, fmt.Errorf("%s must be an object with country and lang", item)
		}
		var loc locale
		for _, f := range []struct {
			name string
			dst  *string
		}{{"country", &loc.Country}, {"lang", &loc.Lang}} {
			if v, ok := members[f.name]; !ok || json.Unmarshal(v, f.dst) != nil {
				return nil, fmt.Errorf("%s.%s is required (a string)", item, f.name)
			}
		}
		if err := checkStorefrontCountry(item+".country", loc.Country); err != nil {
			return nil, err
		}
		if err := checkStorefrontLang(item+".lang", loc.Lang); err != nil {
			return nil, err
		}
		for f := range members {
			if f != "country" && f != "lang" {
				return nil, fmt.Errorf("%s.%s is not a storefront field (country, lang)", item, f)
			}
		}
		if !slices.Contains(out, loc) {
			out = append(out, loc)
		}
	}
	return out, nil
}
