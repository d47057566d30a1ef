package main

// Reading every row of a query into a slice, the error naming the read.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// queryAll runs sql and scans each row with scan; what names the read in
// the error.
func queryAll[T any](ctx context.Context, q querier, what string, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// queryRows is queryAll for the status page's reads, each row scanned into
// a T in place.
func queryRows[T any](ctx context.Context, tx pgx.Tx, what string, scan func(pgx.CollectableRow, *T) error, sql string, args ...any) ([]T, error) {
	return queryAll(ctx, tx, "status page: "+what, func(r pgx.CollectableRow) (T, error) {
		var v T
		return v, scan(r, &v)
	}, sql, args...)
}
