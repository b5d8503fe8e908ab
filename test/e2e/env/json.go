package env

import "encoding/json"

func jsonOf(v any) ([]byte, error) { return json.Marshal(v) }

func fromJSON(data []byte, v any) error { return json.Unmarshal(data, v) }
