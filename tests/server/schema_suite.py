"""Fifty JSON Schemas, each with a request for the model, for the structured-output suite
(test_schemas.py). They cover what applications send: scalars, enums and constants, string
lengths, patterns and formats, number ranges, arrays with bounds and tuples, nested and
optional properties, nullable fields, anyOf, $ref with $defs, and closed or open objects.

Strings and arrays are bounded where a small model could otherwise go on until its tokens
run out: a schema without bounds is satisfiable, but not within a fixed `max_tokens`.
"""

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SHORT = {"type": "string", "maxLength": 40}
SMALL_INT = {"type": "integer", "minimum": -1000, "maximum": 1000}


def obj(properties, required=None, additional=False):
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": additional,
    }


def bounded_array(items, lo=0, hi=4):
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


SUITE = [
    ("integer", {"type": "integer", "minimum": 0, "maximum": 100},
     "How many legs does a spider have?"),
    ("number", {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.001},
     "What is pi to three decimals?"),
    ("boolean", {"type": "boolean"}, "Is the sky blue?"),
    ("string", SHORT, "Name a color."),
    ("null", {"type": "null"}, "Say nothing."),
    ("enum_color", {"enum": ["red", "green", "blue"]}, "Pick a primary color of light."),
    ("enum_mixed", {"enum": [1, "two", None, True]}, "Pick one."),
    ("const", obj({"version": {"const": 2}, "name": NAME}), "Describe version 2 of a tool."),
    ("person", obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
     "Invent a person."),
    ("city", obj({"city": NAME, "country": NAME, "population": {"type": "integer", "minimum": 0,
                                                                "maximum": 50_000_000}}),
     "Describe Paris."),
    ("min_length", obj({"word": {"type": "string", "minLength": 3, "maxLength": 12}}),
     "Give me a long word."),
    ("pattern_zip", obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
     "Give a US zip code."),
    ("pattern_code", obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}}),
     "Give a product code."),
    ("format_date", obj({"day": {"type": "string", "format": "date"}}), "When is new year 2030?"),
    ("format_email", obj({"email": {"type": "string", "format": "email", "maxLength": 40}}),
     "Give an example email address."),
    ("format_ipv4", obj({"ip": {"type": "string", "format": "ipv4"}}), "What is localhost's IP?"),
    ("format_uuid", obj({"id": {"type": "string", "format": "uuid"}}), "Make up an id."),
    ("int_range", obj({"score": {"type": "integer", "minimum": 1, "maximum": 10}}),
     "Rate pizza from 1 to 10."),
    ("exclusive_range", obj({"t": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1,
                                 "multipleOf": 0.01}}),
     "A probability."),
    ("negative", obj({"depth": {"type": "integer", "maximum": -1, "minimum": -11000}}),
     "How deep is the ocean, as a negative number of meters?"),
    ("multiple_types", obj({"value": {"type": ["integer", "string"], "maximum": 1000, "minimum": 0,
                                         "maxLength": 20}}), "Give a value."),
    ("nullable", obj({"nickname": {"type": ["string", "null"], "maxLength": 16}}),
     "Does the cat have a nickname?"),
    ("optional", obj({"title": NAME, "subtitle": SHORT}, required=["title"]), "Title a book."),
    ("all_optional", obj({"a": {"type": "integer"}, "b": {"type": "boolean"}}, required=[]),
     "Any object."),
    ("array_ints", bounded_array({"type": "integer"}, 1, 5), "List some primes."),
    ("array_strings", bounded_array(NAME, 2, 4), "List some fruits."),
    ("array_exact", bounded_array({"type": "integer", "minimum": 0, "maximum": 9}, 3, 3),
     "Three digits."),
    ("array_enum", bounded_array({"enum": ["N", "S", "E", "W"]}, 1, 4), "Directions."),
    ("tuple", {"type": "array", "prefixItems": [NAME, SMALL_INT], "items": False,
               "minItems": 2}, "A name and a number."),
    ("object_in_array", bounded_array(obj({"name": NAME, "qty": {"type": "integer", "minimum": 1,
                                                                  "maximum": 99}}), 1, 3),
     "A shopping list."),
    ("nested", obj({"user": obj({"id": {"type": "integer"}, "name": NAME}),
                    "active": {"type": "boolean"}}), "Describe a user account."),
    ("deep", obj({"a": obj({"b": obj({"c": obj({"d": SMALL_INT})})})}), "Nest it."),
    ("matrix", bounded_array(bounded_array({"type": "integer"}, 2, 2), 2, 2), "A 2 by 2 matrix."),
    ("any_of", obj({"shape": {"anyOf": [obj({"radius": {"type": "number"}}),
                                        obj({"side": {"type": "number"}})]}}), "Describe a shape."),
    ("any_of_scalars", {"anyOf": [SMALL_INT, {"type": "boolean"}]}, "Yes or a count."),
    ("defs_ref", {"$defs": {"point": obj({"x": {"type": "number"}, "y": {"type": "number"}})},
                  **obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}})},
     "A line segment."),
    ("nested_defs", {"$defs": {"leaf": obj({"name": NAME}),
                               "node": obj({"name": NAME,
                                            "children": bounded_array({"$ref": "#/$defs/leaf"}, 0, 2)})},
                     "$ref": "#/$defs/node"}, "A parent and children."),
    ("open_object", {**obj({"kind": NAME}, additional=NAME), "maxProperties": 3},
     "Describe an animal."),
    ("typed_additional", {"type": "object", "additionalProperties": {"type": "integer"},
                          "maxProperties": 4}, "Count some things by name."),
    ("empty_object", {"type": "object", "properties": {}, "additionalProperties": False},
     "An empty object."),
    ("event", obj({"title": NAME, "date": {"type": "string", "format": "date"},
                   "attendees": bounded_array(NAME, 0, 3)}), "Plan a party."),
    ("order", obj({"order_id": {"type": "string", "pattern": "^ORD[0-9]{4}$"},
                   "items": bounded_array(obj({"sku": NAME, "price": {"type": "number",
                                                                      "minimum": 0}}), 1, 2),
                   "paid": {"type": "boolean"}}), "An online order."),
    ("weather", obj({"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]},
                     "temperature": {"type": "number", "minimum": -90, "maximum": 60}}),
     "The weather in Oslo."),
    ("classification", obj({"label": {"enum": ["positive", "negative", "neutral"]},
                            "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
     "Classify: 'I love this movie'."),
    ("extraction", obj({"people": bounded_array(NAME, 0, 3), "places": bounded_array(NAME, 0, 3)}),
     "Extract from: 'Ana met Bo in Lima.'"),
    ("sql", obj({"table": {"type": "string", "pattern": "^[a-z_]{1,16}$"},
                 "columns": bounded_array({"type": "string", "pattern": "^[a-z_]{1,16}$"}, 1, 3),
                 "limit": {"type": "integer", "minimum": 1, "maximum": 100}}),
     "Query the users table."),
    ("unicode", obj({"greeting": {"type": "string", "maxLength": 20}}), "Say hello in Japanese."),
    ("keys_with_spaces", obj({"first name": NAME, "last-name": NAME}), "A full name."),
    ("many_fields", obj({f"f{i}": {"type": "integer", "minimum": 0, "maximum": 9}
                         for i in range(8)}), "Eight digits as fields."),
    ("steps", obj({"steps": bounded_array(obj({"n": {"type": "integer", "minimum": 1, "maximum": 5},
                                                "action": SHORT}), 1, 3),
                   "done": {"type": "boolean"}}), "How to make tea."),
]
