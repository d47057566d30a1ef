package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
)

// registryAPI serves the app registry: create, list, get, update and soft
// delete over apps_registry_application.
type registryAPI struct {
	store   *appStore
	token   string         // empty: writes need no token (loopback only, see config)
	locales localeDefaults // PLAYSTORE_*: the storefront of an app's last_crawl
	logger  *slog.Logger
	reviews *reviewsAPI // GET /api/v1/reviews and the apps' stats (reviews_api.go)
}

const (
	defaultListLimit = 100
	maxListLimit     = 500
)

// routeMux is what register needs of an *http.ServeMux; a test passes a
// recorder to compare the routes with the OpenAPI document.
type routeMux interface {
	HandleFunc(pattern string, handler func(http.ResponseWriter, *http.Request))
}

// register adds the registry's routes. A pattern without a method answers
// the methods its path does not serve with 405.
func (api *registryAPI) register(mux routeMux) {
	mux.HandleFunc("GET /api/v1/openapi.json", serveOpenAPI)
	mux.HandleFunc("/api/v1/openapi.json", methodNotAllowed("GET"))
	mux.HandleFunc("POST /api/v1/apps", api.requireToken(api.create))
	mux.HandleFunc("GET /api/v1/apps", api.list)
	mux.HandleFunc("GET /api/v1/apps/{package_name}", api.get)
	mux.HandleFunc("PATCH /api/v1/apps/{package_name}", api.requireToken(api.update))
	mux.HandleFunc("DELETE /api/v1/apps/{package_name}", api.requireToken(api.delete))
	mux.HandleFunc("/api/v1/apps", methodNotAllowed("GET, POST"))
	mux.HandleFunc("/api/v1/apps/{package_name}", methodNotAllowed("GET, PATCH, DELETE"))
	api.reviews.register(mux)
}

func (api *registryAPI) requireToken(next http.HandlerFunc) http.HandlerFunc {
	return requireTokenGiven(func() string { return api.token }, bearerToken, bearerChallenge, func(w http.ResponseWriter) {
		writeError(w, http.StatusUnauthorized, "writes need the header Authorization: Bearer <REGISTRY_TOKEN>")
	}, next)
}

func (api *registryAPI) create(w http.ResponseWriter, r *http.Request) {
	n, ok := decodeParsed(w, r, parseCreate)
	if !ok {
		return
	}
	a, err := api.store.Create(r.Context(), n)
	var exists *appExistsError
	switch {
	case errors.As(err, &exists) && exists.Active:
		writeError(w, http.StatusConflict, fmt.Sprintf("%s is already registered", n.PackageName))
	case errors.As(err, &exists):
		writeError(w, http.StatusConflict, fmt.Sprintf(
			"%s is registered but inactive; reactivate it with PATCH /api/v1/apps/%s {\"is_active\": true}", n.PackageName, n.PackageName))
	case err != nil:
		api.internalError(w, r, err)
	default:
		w.Header().Set("Location", "/api/v1/apps/"+a.PackageName)
		writeJSON(w, http.StatusCreated, api.resolved(a))
	}
}

type listAppsResponse struct {
	Apps       []app   `json:"apps"`
	NextCursor *string `json:"next_cursor"`
}

func (api *registryAPI) list(w http.ResponseWriter, r *http.Request) {
	f, err := parseListQuery(r, api.locales)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	limit := f.Limit
	f.Limit++ // one more tells whether another page exists
	apps, err := api.store.List(r.Context(), f)
	if err != nil {
		api.internalError(w, r, err)
		return
	}
	for i := range apps {
		apps[i] = api.resolved(apps[i])
	}
	resp := listAppsResponse{Apps: apps}
	if len(apps) > limit {
		resp.Apps = apps[:limit]
		resp.NextCursor = &apps[limit-1].PackageName
	}
	writeJSON(w, http.StatusOK, resp)
}

func parseListQuery(r *http.Request, locales localeDefaults) (appFilter, error) {
	f := appFilter{Limit: defaultListLimit, Locales: locales}
	active := true
	f.Active = &active
	q, err := parseQuery(r.URL.RawQuery)
	if err != nil {
		return f, err
	}
	for key, v := range q {
		switch key {
		case "active":
			if v == "all" {
				f.Active = nil
				continue
			}
			b, err := strconv.ParseBool(v)
			if err != nil {
				return f, fmt.Errorf("active must be true, false or all, not %q", v)
			}
			f.Active = &b
		case "messaging", "iranian":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return f, fmt.Errorf("%s must be true or false, not %q", key, v)
			}
			if key == "messaging" {
				f.Messaging = &b
			} else {
				f.Iranian = &b
			}
		case "country":
			if err := validateCountry("country", v); err != nil {
				return f, err
			}
			f.Country = v
		case "lang":
			if err := validateLang("lang", v); err != nil {
				return f, err
			}
			f.Lang = v
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxListLimit {
				return f, fmt.Errorf("limit must be an integer from 1 to %d, not %q", maxListLimit, v)
			}
			f.Limit = n
		case "cursor":
			// The package name to list after; any valid one will do, so the
			// OpenAPI document can say exactly which cursors are accepted.
			if validatePackageName(v) != nil {
				return f, fmt.Errorf("cursor %q is not a package name, as next_cursor gives", v)
			}
			f.After = v
		default:
			return f, fmt.Errorf("unknown query parameter %q (known: active, messaging, iranian, country, lang, limit, cursor)", key)
		}
	}
	return f, nil
}

// parseQuery reads a query string in which each parameter may appear once.
func parseQuery(raw string) (map[string]string, error) {
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return nil, fmt.Errorf("malformed query string: %w", err)
	}
	out := make(map[string]string, len(vals))
	for k, v := range vals {
		if len(v) > 1 {
			return nil, fmt.Errorf("query parameter %q is given %d times", k, len(v))
		}
		out[k] = v[0]
	}
	return out, nil
}

func (api *registryAPI) get(w http.ResponseWriter, r *http.Request) {
	pkg, ok := pathPackage(w, r)
	if !ok {
		return
	}
	a, err := api.store.Get(r.Context(), pkg)
	if api.appFailed(w, r, pkg, err) {
		return
	}
	out, err := api.withLastCrawls(r.Context(), a)
	if err != nil {
		api.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// appFailed answers what went wrong reading or writing app pkg, if
// anything did, and says whether it answered.
func (api *registryAPI) appFailed(w http.ResponseWriter, r *http.Request, pkg string, err error) bool {
	return answeredError(w, r, err, errAppNotFound, pkg+" is not registered", api.internalError)
}

func (api *registryAPI) update(w http.ResponseWriter, r *http.Request) {
	pkg, ok := pathPackage(w, r)
	if !ok {
		return
	}
	p, ok := decodeParsed(w, r, parsePatch)
	if !ok {
		return
	}
	a, err := api.store.Update(r.Context(), pkg, p)
	if !api.appFailed(w, r, pkg, err) {
		writeJSON(w, http.StatusOK, api.resolved(a))
	}
}

// parseCreate reads a POST body: package_name is required, null for a
// display name or category is the same as leaving it out.
func parseCreate(members map[string]json.RawMessage) (newApp, error) {
	var n newApp
	var pkg *string
	for field, v := range members {
		isNull := string(v) == "null"
		var err error
		switch field {
		case "package_name":
			err = decodeField(field, v, &pkg, "a string")
			if err == nil && pkg == nil {
				err = errors.New("package_name must be a string, not null")
			}
		case "display_name":
			if !isNull {
				err = errors.Join(decodeField(field, v, &n.DisplayName, "a string or null"), validateText(field, n.DisplayName, 255))
			}
		case "category":
			if !isNull {
				err = errors.Join(decodeField(field, v, &n.Category, "a string or null"), validateText(field, n.Category, 100))
			}
		case "is_messaging_app":
			err = decodeBoolInto(field, v, isNull, &n.IsMessagingApp)
		case "is_iranian_app":
			err = decodeBoolInto(field, v, isNull, &n.IsIranianApp)
		case "storefronts":
			if !isNull { // null, like leaving it out: the default storefront
				n.Storefronts, err = parseStorefronts(v)
			}
		default:
			err = fmt.Errorf("unknown field %q (known: package_name, display_name, category, is_messaging_app, is_iranian_app, storefronts)", field)
		}
		if err != nil {
			return n, err
		}
	}
	if pkg == nil {
		return n, errors.New("package_name is required")
	}
	n.PackageName = *pkg
	return n, validatePackageName(n.PackageName)
}

// parsePatch reads a PATCH body: only the named fields change, null clears
// display_name or category, and storefronts replaces the list (null: back to
// the app's default storefront).
func parsePatch(raw map[string]json.RawMessage) (appPatch, error) {
	var p appPatch
	if len(raw) == 0 {
		return p, errors.New("the body names no field to change (display_name, category, is_messaging_app, is_iranian_app, is_active, storefronts)")
	}
	for field, v := range raw {
		isNull := string(v) == "null"
		var err error
		switch field {
		case "display_name":
			p.ClearDisplayName = isNull
			if !isNull {
				err = decodeField(field, v, &p.DisplayName, "a string or null")
			}
			err = errors.Join(err, validateText(field, p.DisplayName, 255))
		case "category":
			p.ClearCategory = isNull
			if !isNull {
				err = decodeField(field, v, &p.Category, "a string or null")
			}
			err = errors.Join(err, validateText(field, p.Category, 100))
		case "is_messaging_app":
			err = decodeBool(field, v, isNull, &p.IsMessagingApp)
		case "is_iranian_app":
			err = decodeBool(field, v, isNull, &p.IsIranianApp)
		case "is_active":
			err = decodeBool(field, v, isNull, &p.IsActive)
		case "storefronts":
			p.SetStorefronts = true
			if !isNull {
				p.Storefronts, err = parseStorefronts(v)
			}
		case "package_name", "id", "created_at", "updated_at":
			err = fmt.Errorf("%s cannot be changed", field)
		default:
			err = fmt.Errorf("unknown field %q", field)
		}
		if err != nil {
			return p, err
		}
	}
	return p, nil
}

func decodeField(field string, v json.RawMessage, dst any, want string) error {
	if err := json.Unmarshal(v, dst); err != nil {
		return fmt.Errorf("%s has the wrong type: want %s", field, want)
	}
	return nil
}

func decodeBool(field string, v json.RawMessage, isNull bool, dst **bool) error {
	if isNull {
		return fmt.Errorf("%s must be true or false, not null", field)
	}
	return decodeField(field, v, dst, "true or false")
}

// decodeBoolInto is decodeBool for a field that is not optional once given.
func decodeBoolInto(field string, v json.RawMessage, isNull bool, dst *bool) error {
	var b *bool
	if err := decodeBool(field, v, isNull, &b); err != nil {
		return err
	}
	*dst = *b
	return nil
}

func (api *registryAPI) delete(w http.ResponseWriter, r *http.Request) {
	pkg, ok := pathPackage(w, r)
	if !ok {
		return
	}
	if !api.appFailed(w, r, pkg, api.store.Deactivate(r.Context(), pkg)) {
		w.WriteHeader(http.StatusNoContent)
	}
}

func pathPackage(w http.ResponseWriter, r *http.Request) (string, bool) {
	pkg := r.PathValue("package_name")
	if err := validatePackageName(pkg); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	return pkg, true
}

func (api *registryAPI) internalError(w http.ResponseWriter, r *http.Request, err error) {
	writeRequestFailed(w, r, api.logger, "registry", err)
}
