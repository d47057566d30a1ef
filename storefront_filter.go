package main

import (
	"encoding/json"
	"fmt"
	"slices"
)

// decodeStorefronts reads name, a filter's list of {"country", "lang"}
// objects checked as the registry checks an app's (an empty list: every
// storefront); a storefront given twice counts once.
func decodeStorefronts(name string, v json.RawMessage) ([]locale, error) {
	var raw []json.RawMessage
	if json.Unmarshal(v, &raw) != nil || string(v) == "null" {
		return nil, fmt.Errorf("%s must be a list of storefronts such as [{\"country\": \"us\", \"lang\": \"en\"}]", name)
	}
	if len(raw) > maxStorefronts {
		return nil, fmt.Errorf("%s must list at most %d storefronts", name, maxStorefronts)
	}
	var out []locale
	for i, r := range raw {
		loc, err := parseStorefront(fmt.Sprintf("%s[%d]", name, i), r)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, loc) {
			out = append(out, loc)
		}
	}
	return out, nil
}
