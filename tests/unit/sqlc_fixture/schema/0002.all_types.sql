CREATE TABLE all_types (
    id              bigserial   PRIMARY KEY,
    c_serial        serial      NOT NULL,
    c_smallint      smallint    NOT NULL,
    c_int2          int2,
    c_integer       integer     NOT NULL,
    c_int4          int4,
    c_bigint        bigint      NOT NULL,
    c_int8          int8,
    c_boolean       boolean     NOT NULL,
    c_bool          bool,
    c_real          real        NOT NULL,
    c_float4        float4,
    c_double        double precision NOT NULL,
    c_float8        float8,
    c_numeric       numeric(12, 3) NOT NULL,
    c_decimal       decimal,
    c_text          text        NOT NULL,
    c_varchar       varchar(20),
    c_charvar       character varying,
    c_bpchar        char(3),
    c_character     character(2),
    c_name          name,
    c_uuid          uuid        NOT NULL,
    c_jsonb         jsonb       NOT NULL,
    c_json          json,
    c_timestamptz   timestamptz NOT NULL,
    c_ts_tz         timestamp with time zone,
    c_timestamp     timestamp,
    c_ts_notz       timestamp without time zone,
    c_date          date,
    c_time          time,
    c_interval      interval,
    c_bytea         bytea,
    c_mood          mood        NOT NULL,
    c_mood_null     mood,
    c_text_array    text[]      NOT NULL,
    c_int_array     integer[],
    c_uuid_array    uuid[],
    c_jsonb_array   jsonb[],
    c_mood_array    mood[]
);

CREATE SCHEMA audit;

CREATE TABLE audit.entries (
    id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    note text   NOT NULL
);
