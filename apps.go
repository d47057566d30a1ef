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
	// read in its default storefront (localeDefaults.storefronts). The
	// registry API shows the resolved list (registryAPI.resolved).
	Storefronts []locale `json:"storefronts"`
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

// queryApps runs sql, which selects appColumns, for its apps; what names
// the read in the error.
func queryApps(ctx context.Context, q querier, what, sql string, args ...any) ([]app, error) {
	return queryAll(ctx, q, what, func(r pgx.CollectableRow) (app, error) { return scanApp(r) }, sql, args...)
}

// newApp is what a client may set when registering an app.
type newApp struct {
	PackageName    string
	DisplayName    *string
	Category       *string
	IsMessagingApp bool
	IsIranianApp   bool
	Storefronts    []locale // nil: the app's default storefront
}

// Create registers an app and its storefronts in one transaction.
func (s *appStore) Create(ctx context.Context, n newApp) (app, error) {
	var a app
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `
		INSERT INTO apps_registry_application (package_name, display_name, category, is_messaging_app, is_iranian_app)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (package_name) DO NOTHING
		RETURNING id`,
			n.PackageName, n.DisplayName, n.Category, n.IsMessagingApp, n.IsIranianApp).Scan(&id); err != nil {
			return err
		}
		var err error
		a, err = writeStorefronts(ctx, tx, id, n.Storefronts)
		return err
	})
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
	// Country and Lang ("": any) select apps with such a storefront, the
	// default one (from Locales) of an app registered without any included.
	Country, Lang string
	Locales       localeDefaults
	After         string // package_name of the last app of the previous page
	Limit         int
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
	if f.Country != "" || f.Lang != "" {
		args = append(args, f.Country, f.Lang, f.Locales.Default.Country, f.Locales.Default.Lang,
			f.Locales.Iranian.Country, f.Locales.Iranian.Lang)
		n := len(args)
		where = append(where, fmt.Sprintf(`EXISTS (
			SELECT 1 FROM (
				SELECT f.country, f.lang FROM app_storefronts f WHERE f.application_id = apps_registry_application.id
				UNION ALL
				SELECT CASE WHEN is_iranian_app THEN $%[5]d::text ELSE $%[3]d::text END,
				       CASE WHEN is_iranian_app THEN $%[6]d::text ELSE $%[4]d::text END
				 WHERE NOT EXISTS (SELECT 1 FROM app_storefronts g WHERE g.application_id = apps_registry_application.id)
			) s WHERE ($%[1]d::text = '' OR s.country = $%[1]d::text) AND ($%[2]d::text = '' OR s.lang = $%[2]d::text))`,
			n-5, n-4, n-3, n-2, n-1, n))
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
	return queryApps(ctx, s.reads, "list apps", q, args...)
}

// ListActive returns the apps the crawler reads, in registration order.
func (s *appStore) ListActive(ctx context.Context) ([]app, error) {
	return queryApps(ctx, s.pool, "list active apps", `SELECT `+appColumns+` FROM apps_registry_application WHERE is_active ORDER BY id`)
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
	// SetStorefronts replaces the app's storefronts with Storefronts; nil
	// Storefronts: back to the default storefront.
	SetStorefronts bool
	Storefronts    []locale
}

// Update changes the app row and, when the patch names them, replaces its
// storefronts, in one transaction. The row is updated in any case, so
// updated_at moves (and the row lock orders concurrent patches).
func (s *appStore) Update(ctx context.Context, pkg string, p appPatch) (app, error) {
	var a app
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `
		UPDATE apps_registry_application SET
			display_name     = CASE WHEN $2 THEN NULL ELSE coalesce($3, display_name) END,
			category         = CASE WHEN $4 THEN NULL ELSE coalesce($5, category) END,
			is_messaging_app = coalesce($6, is_messaging_app),
			is_iranian_app   = coalesce($7, is_iranian_app),
			is_active        = coalesce($8, is_active)
		WHERE package_name = $1
		RETURNING id`,
			pkg, p.ClearDisplayName, p.DisplayName, p.ClearCategory, p.Category, p.IsMessagingApp, p.IsIranianApp, p.IsActive).Scan(&id); err != nil {
			return err
		}
		if p.SetStorefronts {
			if _, err := tx.Exec(ctx, `DELETE FROM app_storefronts WHERE application_id = $1`, id); err != nil {
				return err
			}
		}
		var err error
		a, err = writeStorefronts(ctx, tx, id, p.Storefronts)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return app{}, errAppNotFound
	}
	if err != nil {
		return app{}, fmt.Errorf("update %s: %w", pkg, err)
	}
	return a, nil
}

// writeStorefronts adds the app's storefronts in order (none: nothing to
// add) and reads the app back as the transaction sees it.
func writeStorefronts(ctx context.Context, tx pgx.Tx, id int64, sfs []locale) (app, error) {
	if len(sfs) > 0 {
		countries, langs := make([]string, len(sfs)), make([]string, len(sfs))
		for i, sf := range sfs {
			countries[i], langs[i] = sf.Country, sf.Lang
		}
		if _, err := tx.Exec(ctx, `
		INSERT INTO app_storefronts (application_id, position, country, lang)
		SELECT $1, t.ord - 1, t.country, t.lang FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS t(country, lang, ord)`,
			id, countries, langs); err != nil {
			return app{}, fmt.Errorf("storefronts: %w", err)
		}
	}
	return scanApp(tx.QueryRow(ctx, `SELECT `+appColumns+` FROM apps_registry_application WHERE id = $1`, id))
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
