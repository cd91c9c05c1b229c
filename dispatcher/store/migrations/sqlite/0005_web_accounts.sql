-- Web accounts added at run time (`dispatcher accounts add`), with the models
-- each serves (a JSON list); profiles' own lists seed the rest and are never
-- stored here.
CREATE TABLE web_accounts (
    name TEXT PRIMARY KEY,
    models TEXT NOT NULL,
    added_at REAL NOT NULL
);
