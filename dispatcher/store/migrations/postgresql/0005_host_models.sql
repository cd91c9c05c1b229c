-- The models each host runs (its loaded profiles with an open lane), so any
-- host accepts a task for a model only another live host runs. `card` is
-- what intake needs to build the task row without the profile (JSON text).
CREATE TABLE host_models (
    host TEXT NOT NULL,
    model TEXT NOT NULL,
    card TEXT NOT NULL,
    PRIMARY KEY (host, model)
);
