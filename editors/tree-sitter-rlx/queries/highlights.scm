; rlx highlights (Neovim, Helix, Zed). Capture names follow the common tree-sitter conventions.

(comment) @comment
((comment) @comment.documentation
  (#match? @comment.documentation "^///[^/]"))

(string) @string
(number) @number
(signed_number) @number
(boolean) @boolean
(std_path) @module
(package_path) @module
(data_path) @string.special.path

[
  "import"
  "input"
  "param"
  "state"
  "update"
  "let"
  "rubric"
  "metric"
  "keep"
  "when"
  "rollout"
  "criterion"
  "criteria"
  "interact"
  "aggregate"
  "on_veto"
  "shape"
  "weight"
  "points"
  "levels"
  "veto"
  "critical"
  "saturate"
  "product"
] @keyword

"fn" @keyword.function
"over" @keyword.operator

[
  "reward"
  "advantage"
  "loss"
] @keyword

[
  "and"
  "or"
  "not"
] @keyword.operator

(role) @type.qualifier
(element_type) @type.builtin
(type axis: (identifier) @constant.builtin)
(keep_section level: _ @constant.builtin)
(axis (identifier) @constant.builtin)

"inf" @constant.builtin
"other" @variable.builtin

(function_declaration name: (identifier) @function)
(parameter name: (identifier) @variable.parameter)
(call function: (identifier) @function.call)
((call function: (identifier) @function.builtin)
  (#match? @function.builtin "^(exp|log|log1p|sqrt|sigmoid|logsigmoid|tanh|softplus|abs|floor|min|max|pow|clamp|where|stopgrad|cos|dot|outer|sin|sign|lgamma|sum|mean|std|var|count|any|all|logsumexp|softmax|scan|shift|distinct_ngrams|rank|quantile|uniform|components)$"))
(argument name: (identifier) @variable.parameter)

(input_declaration name: (identifier) @variable)
(param_declaration name: (identifier) @constant)
(state_declaration name: (identifier) @variable)
(let_declaration name: (identifier) @variable)
(local_let name: (identifier) @variable)
(metric_section name: (identifier) @property)
(rubric_declaration name: (identifier) @type)
(criterion name: (identifier) @constant)
(index criterion: (identifier) @constant)
(shape_call name: (identifier) @function.call)
(shape_argument name: (identifier) @variable.parameter)
(rollout_entry key: (identifier) @property)
(import_list (identifier) @function)

((identifier) @variable.builtin
  (#match? @variable.builtin "^(step|progress|n|resp_index|length|token_index|pi)$"))

[
  "="
  "=="
  "!="
  "<"
  "<="
  ">"
  ">="
  "+"
  "-"
  "*"
  "/"
  "^"
] @operator

[
  "("
  ")"
  "["
  "]"
  "{"
  "}"
] @punctuation.bracket

[
  ","
  "."
  ":"
] @punctuation.delimiter
