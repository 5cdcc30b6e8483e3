-- name: InsertAllTypes :one
INSERT INTO jobrun.all_types (
    c_smallint, c_int2, c_integer, c_int4, c_bigint, c_int8, c_boolean, c_bool,
    c_real, c_float4, c_double, c_float8, c_numeric, c_decimal,
    c_text, c_varchar, c_charvar, c_bpchar, c_character, c_name, c_uuid,
    c_jsonb, c_json, c_timestamptz, c_ts_tz, c_timestamp, c_ts_notz, c_date, c_time,
    c_interval, c_bytea, c_mood, c_mood_null,
    c_text_array, c_int_array, c_uuid_array, c_jsonb_array, c_mood_array
) VALUES (
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,
    $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36,
    $37, $38
)
RETURNING *;

-- name: ListAllTypes :many
SELECT * FROM jobrun.all_types ORDER BY id;

-- name: CopyAllTypes :copyfrom
INSERT INTO jobrun.all_types (
    c_smallint, c_int2, c_integer, c_int4, c_bigint, c_int8, c_boolean, c_bool,
    c_real, c_float4, c_double, c_float8, c_numeric, c_decimal,
    c_text, c_varchar, c_charvar, c_bpchar, c_character, c_name, c_uuid,
    c_jsonb, c_json, c_timestamptz, c_ts_tz, c_timestamp, c_ts_notz, c_date, c_time,
    c_interval, c_bytea, c_mood, c_mood_null,
    c_text_array, c_int_array, c_uuid_array, c_jsonb_array
) VALUES (
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,
    $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36,
    $37
);

-- name: CopyMoods :copyfrom
-- mood[] cannot go through binary COPY without registering the type: text COPY.
INSERT INTO jobrun.all_types (c_smallint, c_integer, c_bigint, c_boolean, c_real, c_double,
    c_numeric, c_text, c_uuid, c_jsonb, c_timestamptz, c_mood, c_text_array, c_mood_array)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14);

-- name: Expressions :one
SELECT 1::smallint AS a_smallint, 2::bigint AS a_bigint, 1.5::real AS a_real,
    2.5::double precision AS a_double, 3.25::numeric AS a_numeric, true AS a_bool,
    'x'::varchar AS a_varchar, 'y'::char(2) AS a_char, now() AS a_now,
    now()::timestamp AS a_timestamp, now()::date AS a_date, interval '1 day' AS an_interval,
    '\x00ff'::bytea AS a_bytea, '{"a": 1}'::json AS a_json, gen_random_uuid() AS a_uuid,
    'happy'::jobrun.mood AS a_mood, ARRAY['sad', 'so-so']::jobrun.mood[] AS some_moods,
    ARRAY[1, 2]::int[] AS some_ints, 'n'::name AS a_name, '12:30'::time AS a_time;

-- name: ListAuditEntries :many
SELECT * FROM audit.entries ORDER BY id;

-- name: AddAuditEntry :one
INSERT INTO audit.entries (note) VALUES ($1) RETURNING *;
