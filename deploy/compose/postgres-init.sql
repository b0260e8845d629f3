-- Demo source table for `docker compose up`, run once by the postgres image when its data
-- volume is first initialised (scripts in /docker-entrypoint-initdb.d are skipped after).
--
-- The primary key matters: with REPLICA IDENTITY DEFAULT, pgoutput sends the key columns
-- of the old row on UPDATE and DELETE, and the key is what records are keyed and merged
-- on downstream. No publication or replication slot is created here: those belong to the
-- capture service's settings (CAPTURE_POSTGRES__PUBLICATION, CAPTURE_POSTGRES__SLOT).

CREATE TABLE public.orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer    text           NOT NULL,
    amount      numeric(12, 2) NOT NULL,
    status      text           NOT NULL DEFAULT 'new',
    created_at  timestamptz    NOT NULL DEFAULT now()
);

INSERT INTO public.orders (customer, amount, status) VALUES
    ('ada',    12.50, 'new'),
    ('grace',  99.00, 'paid'),
    ('edsger',  7.25, 'shipped');
