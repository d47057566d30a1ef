package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// app is one row of apps_registry_application.
type app struct {
	ID             int64     `json:"id"`
	PackageName    string    `json:"package_name"`
	DisplayName    *string   `json:"display_name"`
	Category       *string   `json:"category"`
	IsMessagingApp bool      `json:"is_messaging_app"`
	IsIranianApp   bool      `json:"is_iranian_app"`
	IsActive       bool      `json:"is_active"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	// Storefronts are the app_storefronts rows in order; empty: the app is
	// read in its default storefront (localeDefaults.storefronts).
	Storefronts []locale `json:"-"` // GROUNDWORK: the registry API shows them
}

var (
	errAppNotFound = errors.New("app not found")
	// errAppExists is wrapped in *appExistsError, which says whether the
	// existing row is active.
	errAppExists = errors.New("app already registered")
)

type appExistsError struct{ Active bool }

func (e *appExistsError) Error() string { return errAppExists.Error() }
func (e *appExistsError) Unwrap() error { return errAppExists }

// appStore reads and writes the registry table.
type appStore struct {
	pool *pgxpool.Pool
	// reads serves Get, List and LastCrawl: in `run` the registry API's
	// store reads on the status page's pool (openReadPool), whose
	// statements end at READ_STATEMENT_TIMEOUT, so that open GETs never
	// take the connections of the lease and the consumer. Writes, and the
	// read a create does after a conflict, stay on pool.
	reads *pgxpool.Pool
}

func newAppStore(pool *pgxpool.Pool) *appStore { return &appStore{pool: pool, reads: pool} }

// newRegistryStore is the registry API's store: writes on pool, GETs on reads.
func newRegistryStore(pool, reads *pgxpool.Pool) *appStore {
	return &appStore{pool: pool, reads: reads}
}

const appColumns = `id, package_name, display_name, category, is_messaging_app, is_iranian_app, is_active, created_at, updated_at,
	(SELECT coalesce(json_agg(json_build_object('country', f.country, 'lang', f.lang) ORDER BY f.position), '[]')
	   FROM app_storefronts f WHERE f.application_id = apps_registry_application.id)`

func scanApp(row pgx.Row) (app, error) {
	var a app
	err := row.Scan(&a.ID, &a.PackageName, &a.DisplayName, &a.Category, &a.IsMessagingApp,
		&a.IsIranianApp, &a.IsActive, &a.CreatedAt, &a.UpdatedAt, &a.Storefronts)
	return a, err
}

// newApp is what a client may set when registering an app.
type newApp struct {
	PackageName    string
	DisplayName    *string
	Category       *string
	IsMessagingApp bool
	IsIranianApp   bool
}

func (s *appStore) Create(ctx context.Context, n newApp) (app, error) {
	a, err := scanApp(s.pool.QueryRow(ctx, `
		INSERT INTO apps_registry_application (package_name, display_name, category, is_messaging_app, is_iranian_app)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (package_name) DO NOTHING
		RETURNING `+appColumns,
		n.PackageName, n.DisplayName, n.Category, n.IsMessagingApp, n.IsIranianApp))
	if errors.Is(err, pgx.ErrNoRows) {
		existing, gerr := getApp(ctx, s.pool, n.PackageName)
		if gerr != nil {
			return app{}, fmt.Errorf("create %s: %w", n.PackageName, gerr)
		}
		return app{}, &appExistsError{Active: existing.IsActive}
	}
	if err != nil {
		return app{}, fmt.Errorf("create %s: %w", n.PackageName, err)
	}
	return a, nil
}

func (s *appStore) Get(ctx context.Context, pkg string) (app, error) {
	return getApp(ctx, s.reads, pkg)
}

func getApp(ctx context.Context, pool *pgxpool.Pool, pkg string) (app, error) {
	a, err := scanApp(pool.QueryRow(ctx, `SELECT `+appColumns+` FROM apps_registry_application WHERE package_name = $1`, pkg))
	if errors.Is(err, pgx.ErrNoRows) {
		return app{}, errAppNotFound
	}
	if err != nil {
		return app{}, fmt.Errorf("get %s: %w", pkg, err)
	}
	return a, nil
}

// appFilter selects apps for a listing; nil fields do not filter.
type appFilter struct {
	Active    *bool
	Messaging *bool
	Iranian   *bool
	After     string // package_name of the last app of the previous page
	Limit     int
}

// List returns apps ordered by package_name.
func (s *appStore) List(ctx context.Context, f appFilter) ([]app, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.Active != nil {
		add("is_active = $%d", *f.Active)
	}
	if f.Messaging != nil {
		add("is_messaging_app = $%d", *f.Messaging)
	}
	if f.Iranian != nil {
		add("is_iranian_app = $%d", *f.Iranian)
	}
	if f.After != "" {
		add("package_name > $%d", f.After)
	}
	q := `SELECT ` + appColumns + ` FROM apps_registry_application`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, f.Limit)
	q += fmt.Sprintf(" ORDER BY package_name LIMIT $%d", len(args))
	rows, err := s.reads.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list apps: %w", err)
	}
	apps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (app, error) { return scanApp(r) })
	if err != nil {
		return nil, fmt.Errorf("list apps: %w", err)
	}
	return apps, nil
}

// ListActive returns the apps the crawler reads, in registration order.
func (s *appStore) ListActive(ctx context.Context) ([]app, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+appColumns+` FROM apps_registry_application WHERE is_active ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list active apps: %w", err)
	}
	apps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (app, error) { return scanApp(r) })
	if err != nil {
		return nil, fmt.Errorf("list active apps: %w", err)
	}
	return apps, nil
}

// appPatch is a partial update; nil fields stay as they are. ClearDisplayName
// and ClearCategory set the column to NULL.
type appPatch struct {
	DisplayName      *string
	ClearDisplayName bool
	Category         *string
	ClearCategory    bool
	IsMessagingApp   *bool
	IsIranianApp     *bool
	IsActive         *bool
}

func (s *appStore) Update(ctx context.Context, pkg string, p appPatch) (app, error) {
	a, err := scanApp(s.pool.QueryRow(ctx, `
		UPDATE apps_registry_application SET
			display_name     = CASE WHEN $2 THEN NULL ELSE coalesce($3, display_name) END,
			category         = CASE WHEN $4 THEN NULL ELSE coalesce($5, category) END,
			is_messaging_app = coalesce($6, is_messaging_app),
			is_iranian_app   = coalesce($7, is_iranian_app),
			is_active        = coalesce($8, is_active)
		WHERE package_name = $1
		RETURNING `+appColumns,
		pkg, p.ClearDisplayName, p.DisplayName, p.ClearCategory, p.Category, p.IsMessagingApp, p.IsIranianApp, p.IsActive))
	if errors.Is(err, pgx.ErrNoRows) {
		return app{}, errAppNotFound
	}
	if err != nil {
		return app{}, fmt.Errorf("update %s: %w", pkg, err)
	}
	return a, nil
}

// Deactivate soft-deletes an app: the crawler skips it, its history stays.
func (s *appStore) Deactivate(ctx context.Context, pkg string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE apps_registry_application SET is_active = false WHERE package_name = $1`, pkg)
	if err != nil {
		return fmt.Errorf("deactivate %s: %w", pkg, err)
	}
	if tag.RowsAffected() == 0 {
		return errAppNotFound
	}
	return nil
}
