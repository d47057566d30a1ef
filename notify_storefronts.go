package main

import (
	"fmt"
	"strings"
)

// The decider's events are per app and storefront: its queries read an
// app's storefronts as the crawler does (localeDefaults.storefronts).

// storefrontsLateral joins app a (apps_registry_application a) with its
// storefronts as rows sf(country, lang): its app_storefronts rows, else its
// default one, from parameters $p to $p+3 (localeDefaults.args).
func storefrontsLateral(p int) string {
	return fmt.Sprintf(`CROSS JOIN LATERAL (SELECT f.country::text AS country, f.lang::text AS lang FROM app_storefronts f WHERE f.application_id = a.id
	UNION ALL
	SELECT CASE WHEN a.is_iranian_app THEN $%d::text ELSE $%d::text END, CASE WHEN a.is_iranian_app THEN $%d::text ELSE $%d::text END
	WHERE NOT EXISTS (SELECT FROM app_storefronts f WHERE f.application_id = a.id)) sf`, p, p+2, p+1, p+3)
}

// args are the parameters of storefrontsLateral: the Iranian apps'
// country and lang, then the other apps'.
func (d localeDefaults) args() []any {
	return []any{d.Iranian.Country, d.Iranian.Lang, d.Default.Country, d.Default.Lang}
}

// splitStorefront reads "country lang", as the decider's queries give a
// storefront.
func splitStorefront(s string) locale {
	country, lang, _ := strings.Cut(s, " ")
	return locale{Country: country, Lang: lang}
}
