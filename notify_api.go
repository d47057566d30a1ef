package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// notifyAPI serves the notifier's destinations, rules and outbox
// (/api/v1/destinations, /api/v1/rules, /api/v1/notifications). Every verb,
// reads included, needs the registry token when one is set: they reveal
// where alerts go.
type notifyAPI struct {
	pool         *pgxpool.Pool // writes
	reads        *pgxpool.Pool // GETs: in run the read pool, whose statements end at READ_STATEMENT_TIMEOUT
	token        string
	allowPrivate bool              // NOTIFY_ALLOW_PRIVATE: receivers at literal private addresses are accepted
	tester       destinationTester // nil: this process cannot send, POST …/test answers 503
	logger       *slog.Logger
}

// destinationTester sends one test message to a destination now (the
// notifier's sender). httpStatus is the receiver's status, 0 when none
// answered; err's text is what the receiver said, never a secret.
type destinationTester interface {
	Test(ctx context.Context, d destination) (httpStatus int, err error)
}

const (
	defaultNotificationLimit = 50
	maxNotificationLimit     = 500
	// testTimeout bounds POST …/test: the client waits for the receiver.
	testTimeout = 30 * time.Second
)

func (api *notifyAPI) register(mux routeMux) {
	api.registerCollection(mux, "/api/v1/destinations",
		api.createDestination, api.listDestinations, api.getDestination, api.updateDestination, api.deleteDestination)
	mux.HandleFunc("POST /api/v1/destinations/{id}/test", api.auth(api.testDestination))
	mux.HandleFunc("/api/v1/destinations/{id}/test", methodNotAllowed("POST"))

	api.registerCollection(mux, "/api/v1/rules", api.createRule, api.listRules, api.getRule, api.updateRule, api.deleteRule)

	mux.HandleFunc("GET /api/v1/notifications", api.auth(api.listNotifications))
	mux.HandleFunc("/api/v1/notifications", methodNotAllowed("GET"))
}

// registerCollection adds the routes of a collection at path and of its
// members at path/{id}, and the 405s of the methods they do not serve.
func (api *notifyAPI) registerCollection(mux routeMux, path string, create, list, get, update, remove http.HandlerFunc) {
	mux.HandleFunc("POST "+path, api.auth(create))
	mux.HandleFunc("GET "+path, api.auth(list))
	mux.HandleFunc("GET "+path+"/{id}", api.auth(get))
	mux.HandleFunc("PATCH "+path+"/{id}", api.auth(update))
	mux.HandleFunc("DELETE "+path+"/{id}", api.auth(remove))
	mux.HandleFunc(path, methodNotAllowed("GET, POST"))
	mux.HandleFunc(path+"/{id}", methodNotAllowed("GET, PATCH, DELETE"))
}

// auth refuses a request without the registry token when one is set.
func (api *notifyAPI) auth(next http.HandlerFunc) http.HandlerFunc {
	return requireTokenGiven(func() string { return api.token }, bearerToken, bearerChallenge, func(w http.ResponseWriter) {
		writeError(w, http.StatusUnauthorized, "destinations, rules and notifications need the header Authorization: Bearer <REGISTRY_TOKEN>, reads too")
	}, next)
}

func (api *notifyAPI) internalError(w http.ResponseWriter, r *http.Request, err error) {
	writeRequestFailed(w, r, api.logger, "notifier API", err)
}

// patchLoaded reads a PATCH's {id} and its body, which must name a field,
// loads the thing of that id through load and applies the body to it with
// parse; a refusal is answered.
func patchLoaded[T any](w http.ResponseWriter, r *http.Request, q querier,
	load func(http.ResponseWriter, *http.Request, querier, int64) (T, bool),
	parse func(*T, map[string]json.RawMessage, bool) error,
) (thing T, id int64, ok bool) {
	if id, ok = pathID(w, r); !ok {
		return thing, id, false
	}
	members, ok := decodeBody(w, r)
	if !ok {
		return thing, id, false
	}
	if len(members) == 0 {
		writeError(w, http.StatusBadRequest, "the body names no field to change")
		return thing, id, false
	}
	if thing, ok = load(w, r, q, id); !ok {
		return thing, id, false
	}
	if err := parse(&thing, members, false); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return thing, id, false
	}
	return thing, id, true
}

// createParsed reads a POST's body into thing, which holds the defaults,
// with parse; a refusal is answered.
func createParsed[T any](w http.ResponseWriter, r *http.Request, thing T, parse func(*T, map[string]json.RawMessage, bool) error) (T, bool) {
	return decodeParsed(w, r, func(members map[string]json.RawMessage) (T, error) {
		return thing, parse(&thing, members, true)
	})
}

// getLoaded answers a GET of {id} with the thing load finds, as show
// shows it.
func getLoaded[T, J any](w http.ResponseWriter, r *http.Request, q querier,
	load func(http.ResponseWriter, *http.Request, querier, int64) (T, bool), show func(T) J) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	if thing, ok := load(w, r, q, id); ok {
		writeJSON(w, http.StatusOK, show(thing))
	}
}

// pathID reads the {id} of a path: a positive integer.
func pathID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, http.StatusBadRequest, "id must be a positive integer")
		return 0, false
	}
	return id, true
}

// --- destinations ---

// maskedSecret is what a GET shows for a secret; a PATCH that sends it back
// keeps the stored one.
const maskedSecret = "********"

// destinationJSON is a destination as the API shows it: flat, its secrets
// masked, only its type's fields.
type destinationJSON struct {
	ID        int64     `json:"id"`
	Name      string    `json:"name"`
	Type      string    `json:"type"`
	URL       string    `json:"url,omitempty"`
	Secret    string    `json:"secret,omitempty"`
	BotToken  string    `json:"bot_token,omitempty"`
	ChatID    string    `json:"chat_id,omitempty"`
	SMTPHost  string    `json:"smtp_host,omitempty"`
	SMTPPort  int       `json:"smtp_port,omitempty"`
	TLS       string    `json:"tls,omitempty"`
	Username  string    `json:"username,omitempty"`
	Password  string    `json:"password,omitempty"`
	From      string    `json:"from,omitempty"`
	To        []string  `json:"to,omitempty"`
	Status    string    `json:"status"`
	LastError *string   `json:"last_error"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

func maskSecret(s string) string {
	if s == "" {
		return ""
	}
	return maskedSecret
}

// maskURL keeps a secret URL's scheme and host: https://hooks.slack.com/****.
func maskURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return maskedSecret
	}
	host, _, _ := strings.Cut(rest, "/")
	return scheme + "://" + host + "/****"
}

func maskedDestination(d destination) destinationJSON {
	c := d.Config
	out := destinationJSON{
		ID: d.ID, Name: d.Name, Type: d.Type, URL: c.URL, Secret: maskSecret(c.Secret), BotToken: maskSecret(c.BotToken),
		ChatID: c.ChatID, SMTPHost: c.SMTPHost, SMTPPort: c.SMTPPort, TLS: c.TLS, Username: c.Username,
		Password: maskSecret(c.Password), From: c.From, To: c.To, Status: d.Status,
		CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt,
	}
	if urlIsSecret(d.Type) && c.URL != "" {
		out.URL = maskURL(c.URL)
	}
	if d.LastError != "" {
		out.LastError = &d.LastError
	}
	return out
}

// parseDestination applies a POST (create) or PATCH body to d and checks
// the destination that results.
func (api *notifyAPI) parseDestination(d *destination, members map[string]json.RawMessage, create bool) error {
	if err := parseDestinationFields(d, members, create); err != nil {
		return err
	}
	return checkDestination(d, api.allowPrivate)
}

func (api *notifyAPI) createDestination(w http.ResponseWriter, r *http.Request) {
	d, ok := createParsed(w, r, destination{}, api.parseDestination)
	if !ok {
		return
	}
	public, secrets := secretsOf(d.Type, d.Config)
	var id int64
	err := pgx.BeginFunc(r.Context(), api.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(r.Context(), `INSERT INTO notify_destinations (name, type, config) VALUES ($1, $2, $3) RETURNING id`,
			d.Name, d.Type, public).Scan(&id); err != nil {
			return fmt.Errorf("insert destination: %w", err)
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO notify_destination_secrets (destination_id, secrets) VALUES ($1, $2)`, id, secrets); err != nil {
			return fmt.Errorf("insert destination secrets: %w", err)
		}
		return nil
	})
	if err != nil {
		api.internalError(w, r, err)
		return
	}
	stored, err := loadDestination(r.Context(), api.pool, id)
	if err != nil {
		api.internalError(w, r, err)
		return
	}
	api.logger.Info("destination created", "id", id, "name", d.Name, "type", d.Type)
	w.Header().Set("Location", fmt.Sprintf("/api/v1/destinations/%d", id))
	writeJSON(w, http.StatusCreated, maskedDestination(stored))
}

type listDestinationsResponse struct {
	Destinations []destinationJSON `json:"destinations"`
}

func (api *notifyAPI) listDestinations(w http.ResponseWriter, r *http.Request) {
	if q, err := parseQuery(r.URL.RawQuery); err != nil || len(q) > 0 {
		writeError(w, http.StatusBadRequest, "GET /api/v1/destinations takes no query parameters")
		return
	}
	ds, err := queryAll(r.Context(), api.reads, "list destinations", scanDestination, `SELECT `+destinationColumns+`
FROM notify_destinations d LEFT JOIN notify_destination_secrets s ON s.destination_id = d.id ORDER BY d.id`)
	if err != nil {
		api.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, listDestinationsResponse{Destinations: showAll(ds, maskedDestination)})
}

// showAll is things as show shows them; none is [], never null.
func showAll[T, J any](things []T, show func(T) J) []J {
	out := make([]J, 0, len(things))
	for _, t := range things {
		out = append(out, show(t))
	}
	return out
}

// loadDestinationOr404 reads a destination, or answers why it cannot.
func (api *notifyAPI) loadDestinationOr404(w http.ResponseWriter, r *http.Request, q querier, id int64) (destination, bool) {
	d, err := loadDestination(r.Context(), q, id)
	return d, api.foundOr404(w, r, err, errDestinationNotFound, "destination", id)
}

// foundOr404 answers what a load or write of the thing id ended in, unless
// it was found: 404 when the error is notFound, 500 (or 503) for another.
func (api *notifyAPI) foundOr404(w http.ResponseWriter, r *http.Request, err, notFound error, thing string, id int64) bool {
	return !answeredError(w, r, err, notFound, fmt.Sprintf("no %s %d", thing, id), api.internalError)
}

// loadOne reads the row of id that sql selects (its $1) with scan: an id
// no row has is notFound, and what names the thing in the errors.
func loadOne[T any](ctx context.Context, q querier, what string, id int64, notFound error, scan pgx.RowToFunc[T], sql string) (T, error) {
	var zero T
	rows, err := q.Query(ctx, sql, id)
	if err != nil {
		return zero, fmt.Errorf("load %s %d: %w", what, id, err)
	}
	thing, err := pgx.CollectExactlyOneRow(rows, scan)
	if errors.Is(err, pgx.ErrNoRows) {
		return zero, fmt.Errorf("%s %d: %w", what, id, notFound)
	}
	if err != nil {
		return zero, fmt.Errorf("load %s %d: %w", what, id, err)
	}
	return thing, nil
}

func (api *notifyAPI) getDestination(w http.ResponseWriter, r *http.Request) {
	getLoaded(w, r, api.reads, api.loadDestinationOr404, maskedDestination)
}

func (api *notifyAPI) updateDestination(w http.ResponseWriter, r *http.Request) {
	d, id, ok := patchLoaded(w, r, api.pool, api.loadDestinationOr404, api.parseDestination)
	if !ok {
		return
	}
	public, secrets := secretsOf(d.Type, d.Config)
	// A change may be the fix of what broke it: the workers try it again.
	err := pgx.BeginFunc(r.Context(), api.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(r.Context(), `UPDATE notify_destinations SET name = $2, config = $3, status = 'ok', last_error = NULL, updated_at = now() WHERE id = $1`,
			id, d.Name, public)
		if err != nil {
			return fmt.Errorf("update destination %d: %w", id, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("destination %d: %w", id, errDestinationNotFound)
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO notify_destination_secrets (destination_id, secrets) VALUES ($1, $2)
ON CONFLICT (destination_id) DO UPDATE SET secrets = excluded.secrets`, id, secrets); err != nil {
			return fmt.Errorf("update destination %d secrets: %w", id, err)
		}
		return nil
	})
	if !api.foundOr404(w, r, err, errDestinationNotFound, "destination", id) {
		return
	}
	if d, ok := api.loadDestinationOr404(w, r, api.pool, id); ok {
		api.logger.Info("destination updated", "id", id, "name", d.Name, "type", d.Type)
		writeJSON(w, http.StatusOK, maskedDestination(d))
	}
}

// ruleRef names a rule in a 409.
type ruleRef struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
}

type destinationInUseResponse struct {
	Error string    `json:"error"`
	Rules []ruleRef `json:"rules"`
}

func (api *notifyAPI) deleteDestination(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var tag pgconn.CommandTag
	var users []ruleRef
	err := pgx.BeginFunc(r.Context(), api.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(r.Context(), `SELECT r.id, r.name FROM notify_rules r JOIN notify_rule_destinations rd ON rd.rule_id = r.id
WHERE rd.destination_id = $1 ORDER BY r.id FOR SHARE OF r`, id)
		if err != nil {
			return fmt.Errorf("rules of destination %d: %w", id, err)
		}
		users, err = pgx.CollectRows(rows, pgx.RowToStructByPos[ruleRef])
		if err != nil || len(users) > 0 {
			return err
		}
		tag, err = tx.Exec(r.Context(), `DELETE FROM notify_destinations WHERE id = $1`, id)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" {
		// A rule took it up between the look and the delete.
		writeError(w, http.StatusConflict, fmt.Sprintf("destination %d is used by a rule; remove it from the rule first", id))
		return
	}
	switch {
	case err != nil:
		api.internalError(w, r, err)
	case len(users) > 0:
		names := make([]string, len(users))
		for i, u := range users {
			names[i] = fmt.Sprintf("%d (%s)", u.ID, u.Name)
		}
		writeJSON(w, http.StatusConflict, destinationInUseResponse{
			Error: fmt.Sprintf("destination %d is used by rules %s: remove it from them (PATCH /api/v1/rules/ID) or delete them first", id, strings.Join(names, ", ")),
			Rules: users,
		})
	default:
		api.answerDelete(w, tag, "destination", id)
	}
}

// answerDelete answers a DELETE of the thing id that ran: 404 when it
// deleted no row, else 204.
func (api *notifyAPI) answerDelete(w http.ResponseWriter, tag pgconn.CommandTag, thing string, id int64) {
	if tag.RowsAffected() == 0 {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no %s %d", thing, id))
		return
	}
	api.logger.Info(thing+" deleted", "id", id)
	w.WriteHeader(http.StatusNoContent)
}

type destinationTestResponse struct {
	OK         bool   `json:"ok"`
	HTTPStatus int    `json:"http_status,omitempty"`
	Error      string `json:"error,omitempty"`
}

func (api *notifyAPI) testDestination(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	d, ok := api.loadDestinationOr404(w, r, api.pool, id)
	if !ok {
		return
	}
	if api.tester == nil {
		writeError(w, http.StatusServiceUnavailable, "this server does not run the notifier's sender")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), testTimeout)
	defer cancel()
	status, err := api.tester.Test(ctx, d)
	if err == nil {
		if _, err := api.pool.Exec(r.Context(), `UPDATE notify_destinations SET status = 'ok', last_error = NULL, updated_at = now() WHERE id = $1`, id); err != nil {
			api.internalError(w, r, fmt.Errorf("destination %d: mark ok: %w", id, err))
			return
		}
		api.logger.Info("destination test sent", "id", id, "http_status", status)
		writeJSON(w, http.StatusOK, destinationTestResponse{OK: true, HTTPStatus: status})
		return
	}
	msg := scrubSecrets(err.Error(), d)
	if _, err := api.pool.Exec(r.Context(), `UPDATE notify_destinations SET last_error = $2 WHERE id = $1`, id, msg); err != nil {
		api.internalError(w, r, fmt.Errorf("destination %d: record test failure: %w", id, err))
		return
	}
	api.logger.Warn("destination test failed", "id", id, "http_status", status, "err", msg)
	writeJSON(w, http.StatusBadGateway, destinationTestResponse{HTTPStatus: status, Error: msg})
}

// --- rules ---

// ruleJSON is a rule as the API shows it.
type ruleJSON struct {
	ID           int64      `json:"id"`
	Name         string     `json:"name"`
	Event        string     `json:"event"`
	Destinations []int64    `json:"destinations"`
	Apps         []string   `json:"apps"`
	Filter       ruleFilter `json:"filter"`
	MaxPerHour   int        `json:"max_per_hour"`
	Backfill     string     `json:"backfill"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
}

func ruleOut(r notifyRule) ruleJSON {
	dests := r.Destinations
	if dests == nil {
		dests = []int64{}
	}
	return ruleJSON{ID: r.ID, Name: r.Name, Event: r.Event, Destinations: dests, Apps: r.Apps, Filter: r.Filter,
		MaxPerHour: r.MaxPerHour, Backfill: formatDuration(r.Backfill), CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
}

var errRuleNotFound = errors.New("rule not found")

func loadRule(ctx context.Context, q querier, id int64) (notifyRule, error) {
	return loadOne(ctx, q, "rule", id, errRuleNotFound, scanRule, `SELECT `+ruleColumns+` FROM notify_rules r WHERE r.id = $1`)
}

func (api *notifyAPI) loadRuleOr404(w http.ResponseWriter, r *http.Request, q querier, id int64) (notifyRule, bool) {
	rule, err := loadRule(r.Context(), q, id)
	return rule, api.foundOr404(w, r, err, errRuleNotFound, "rule", id)
}

func (api *notifyAPI) createRule(w http.ResponseWriter, r *http.Request) {
	if rule, ok := createParsed(w, r, notifyRule{MaxPerHour: defaultMaxPerHour}, parseRuleFields); ok {
		api.saveRule(w, r, rule, http.StatusCreated)
	}
}

func (api *notifyAPI) updateRule(w http.ResponseWriter, r *http.Request) {
	rule, _, ok := patchLoaded(w, r, api.pool, api.loadRuleOr404, parseRuleFields)
	if !ok {
		return
	}
	api.saveRule(w, r, rule, http.StatusOK)
}

// ruleInputError is a rule that refers to what does not exist.
type ruleInputError struct{ msg string }

func (e *ruleInputError) Error() string { return e.msg }

// saveRule inserts a rule (ID 0) or replaces one, with its destinations,
// after checking what it refers to, and answers with it.
func (api *notifyAPI) saveRule(w http.ResponseWriter, r *http.Request, rule notifyRule, code int) {
	ctx := r.Context()
	filter, err := json.Marshal(rule.Filter)
	if err != nil {
		api.internalError(w, r, err)
		return
	}
	err = pgx.BeginFunc(ctx, api.pool, func(tx pgx.Tx) error {
		if err := checkRuleRefs(ctx, tx, rule); err != nil {
			return err
		}
		backfill := rule.Backfill.Microseconds()
		if rule.ID == 0 {
			if err := tx.QueryRow(ctx, `INSERT INTO notify_rules (name, event, apps, filter, max_per_hour, backfill)
VALUES ($1, $2, $3, $4, $5, $6 * interval '1 microsecond') RETURNING id`,
				rule.Name, rule.Event, rule.Apps, filter, rule.MaxPerHour, backfill).Scan(&rule.ID); err != nil {
				return fmt.Errorf("insert rule: %w", err)
			}
		} else {
			tag, err := tx.Exec(ctx, `UPDATE notify_rules SET name = $2, event = $3, apps = $4, filter = $5, max_per_hour = $6,
backfill = $7 * interval '1 microsecond', updated_at = now() WHERE id = $1`,
				rule.ID, rule.Name, rule.Event, rule.Apps, filter, rule.MaxPerHour, backfill)
			if err != nil {
				return fmt.Errorf("update rule %d: %w", rule.ID, err)
			}
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("rule %d: %w", rule.ID, errRuleNotFound)
			}
			if _, err := tx.Exec(ctx, `DELETE FROM notify_rule_destinations WHERE rule_id = $1 AND NOT destination_id = ANY($2)`, rule.ID, rule.Destinations); err != nil {
				return fmt.Errorf("update rule %d destinations: %w", rule.ID, err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO notify_rule_destinations (rule_id, destination_id) SELECT $1, unnest($2::bigint[]) ON CONFLICT DO NOTHING`,
			rule.ID, rule.Destinations); err != nil {
			return fmt.Errorf("rule destinations: %w", err)
		}
		return nil
	})
	var inputErr *ruleInputError
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &inputErr):
		writeError(w, http.StatusBadRequest, inputErr.msg)
		return
	case errors.As(err, &pgErr) && pgErr.Code == "23503":
		writeError(w, http.StatusBadRequest, "destinations: a destination was deleted meanwhile")
		return
	case errors.Is(err, errRuleNotFound):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no rule %d", rule.ID))
		return
	case err != nil:
		api.internalError(w, r, err)
		return
	}
	stored, ok := api.loadRuleOr404(w, r, api.pool, rule.ID)
	if !ok {
		return
	}
	api.logger.Info("rule saved", "id", stored.ID, "name", stored.Name, "event", stored.Event, "destinations", stored.Destinations)
	if code == http.StatusCreated {
		w.Header().Set("Location", fmt.Sprintf("/api/v1/rules/%d", stored.ID))
	}
	writeJSON(w, code, ruleOut(stored))
}

// checkRuleRefs: the rule's destinations exist (locked, so that none is
// deleted before the commit) and its apps are registered.
func checkRuleRefs(ctx context.Context, tx pgx.Tx, rule notifyRule) error {
	id, err := firstMissing(ctx, tx, `SELECT id FROM notify_destinations WHERE id = ANY($1) FOR KEY SHARE`, rule.Destinations)
	switch {
	case err != nil:
		return fmt.Errorf("look up destinations: %w", err)
	case id != nil:
		return &ruleInputError{fmt.Sprintf("destinations: there is no destination %d", *id)}
	case rule.Apps == nil:
		return nil
	}
	pkg, err := firstMissing(ctx, tx, `SELECT package_name FROM apps_registry_application WHERE package_name = ANY($1)`, rule.Apps)
	switch {
	case err != nil:
		return fmt.Errorf("look up apps: %w", err)
	case pkg != nil:
		return &ruleInputError{fmt.Sprintf("apps: %s is not registered (POST /api/v1/apps)", *pkg)}
	}
	return nil
}

// firstMissing is the first of want that sql, given want as $1, does not
// return; nil when it returns them all.
func firstMissing[T comparable](ctx context.Context, q querier, sql string, want []T) (*T, error) {
	rows, err := q.Query(ctx, sql, want)
	if err != nil {
		return nil, err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		return nil, err
	}
	for i := range want {
		if !slices.Contains(found, want[i]) {
			return &want[i], nil
		}
	}
	return nil, nil
}

type listRulesResponse struct {
	Rules []ruleJSON `json:"rules"`
}

func (api *notifyAPI) listRules(w http.ResponseWriter, r *http.Request) {
	q, err := parseQuery(r.URL.RawQuery)
	if err == nil {
		for k, v := range q {
			if k != "event" {
				err = fmt.Errorf("unknown query parameter %q (known: event)", k)
			} else if !slices.Contains(notifyEvents, v) {
				err = fmt.Errorf("event must be one of %s", strings.Join(notifyEvents, ", "))
			}
		}
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rules, err := loadRules(r.Context(), api.reads, q["event"], nil)
	if err != nil {
		api.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, listRulesResponse{Rules: showAll(rules, ruleOut)})
}

func (api *notifyAPI) getRule(w http.ResponseWriter, r *http.Request) {
	getLoaded(w, r, api.reads, api.loadRuleOr404, ruleOut)
}

func (api *notifyAPI) deleteRule(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	// Its outbox rows go with it (ON DELETE CASCADE): nothing more is sent.
	tag, err := api.pool.Exec(r.Context(), `DELETE FROM notify_rules WHERE id = $1`, id)
	switch {
	case err != nil:
		api.internalError(w, r, fmt.Errorf("delete rule %d: %w", id, err))
	default:
		api.answerDelete(w, tag, "rule", id)
	}
}

// --- notifications ---

// notificationJSON is one outbox row as the API and `notify list` show it.
type notificationJSON struct {
	ID            int64      `json:"id"`
	RuleID        int64      `json:"rule_id"`
	DestinationID int64      `json:"destination_id"`
	Event         string     `json:"event"`
	EventKey      string     `json:"event_key"`
	Status        string     `json:"status"`
	Attempts      int        `json:"attempts"`
	LastError     *string    `json:"last_error"`
	CreatedAt     time.Time  `json:"created_at"`
	SentAt        *time.Time `json:"sent_at"`
}

// notificationFilter picks outbox rows, newest first.
type notificationFilter struct {
	Status        string // "": any
	RuleID        int64  // 0: any
	DestinationID int64  // 0: any
	Before        int64  // 0: from the newest; else ids below it (the cursor)
	Limit         int
}

var notificationStatuses = []string{"pending", "sent", "failed"}

func listNotifications(ctx context.Context, q querier, f notificationFilter) ([]notificationJSON, error) {
	return queryAll(ctx, q, "list notifications", pgx.RowToStructByPos[notificationJSON],
		`SELECT id, rule_id, destination_id, event, event_key, status, attempts, last_error, created_at, sent_at
FROM notifications
WHERE ($1::text = '' OR status = $1) AND ($2::bigint = 0 OR rule_id = $2) AND ($3::bigint = 0 OR destination_id = $3) AND ($4::bigint = 0 OR id < $4)
ORDER BY id DESC LIMIT $5`, f.Status, f.RuleID, f.DestinationID, f.Before, f.Limit)
}

type listNotificationsResponse struct {
	Notifications []notificationJSON `json:"notifications"`
	NextCursor    *string            `json:"next_cursor"`
}

func parseNotificationQuery(raw string) (notificationFilter, error) {
	f := notificationFilter{Limit: defaultNotificationLimit}
	q, err := parseQuery(raw)
	if err != nil {
		return f, err
	}
	positive := func(key, v string) (int64, error) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("%s must be a positive integer, not %q", key, v)
		}
		return n, nil
	}
	for key, v := range q {
		switch key {
		case "status":
			if !slices.Contains(notificationStatuses, v) {
				return f, fmt.Errorf("status must be pending, sent or failed, not %q", v)
			}
			f.Status = v
		case "rule":
			f.RuleID, err = positive(key, v)
		case "destination":
			f.DestinationID, err = positive(key, v)
		case "cursor":
			f.Before, err = positive(key, v)
		case "limit":
			n, perr := strconv.Atoi(v)
			if perr != nil || n < 1 || n > maxNotificationLimit {
				return f, fmt.Errorf("limit must be an integer from 1 to %d, not %q", maxNotificationLimit, v)
			}
			f.Limit = n
		default:
			return f, fmt.Errorf("unknown query parameter %q (known: status, rule, destination, limit, cursor)", key)
		}
		if err != nil {
			return f, err
		}
	}
	return f, nil
}

func (api *notifyAPI) listNotifications(w http.ResponseWriter, r *http.Request) {
	f, err := parseNotificationQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	limit := f.Limit
	f.Limit++ // one more tells whether another page exists
	ns, err := listNotifications(r.Context(), api.reads, f)
	if err != nil {
		api.internalError(w, r, err)
		return
	}
	resp := listNotificationsResponse{Notifications: ns}
	if len(ns) > limit {
		resp.Notifications = ns[:limit]
		next := strconv.FormatInt(ns[limit-1].ID, 10)
		resp.NextCursor = &next
	}
	writeJSON(w, http.StatusOK, resp)
}
